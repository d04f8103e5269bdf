package control

/*
#include <czmq.h>
#include <stdatomic.h>
#include <unistd.h>

// The exit gate. czmq's exit handler closes every socket it tracks and
// ends the context; a plane's thread still using one of those sockets
// then races libzmq's reaper on a socket that is not thread-safe, and the
// context's end can wait for ever. So the threads that own sockets pass
// the gate for each round of work, and fpt's own exit handler, which runs
// before czmq's, closes the gate and waits for the rounds under way.
static atomic_int fpt_exiting;
static atomic_int fpt_in_rounds;

static int fpt_gate_enter(void) {
	atomic_fetch_add(&fpt_in_rounds, 1);
	if (atomic_load(&fpt_exiting)) {
		atomic_fetch_sub(&fpt_in_rounds, 1);
		return 0;
	}
	return 1;
}

static void fpt_gate_leave(void) { atomic_fetch_sub(&fpt_in_rounds, 1); }

// A round is at most one poll of idleWait or zapPoll (1 s); 3 s bounds
// the wait should a thread be stuck elsewhere.
static void fpt_gate_close(void) {
	atomic_store(&fpt_exiting, 1);
	for (int i = 0; i < 3000 && atomic_load(&fpt_in_rounds) > 0; i++) {
		usleep(1000);
	}
}

// Handlers run in the reverse order of registration: registered after
// zsys_init (which registers czmq's), the gate closes first.
static void fpt_zsys_init(void) {
	zsys_init();
	atexit(fpt_gate_close);
}
*/
import "C"

// zsysInitC initialises czmq and registers the exit gate behind it.
func zsysInitC() { C.fpt_zsys_init() }

// enterRound passes the exit gate before a round of work on this thread's
// sockets; false once the process is exiting: the thread must then never
// touch a socket again (parkForExit).
func enterRound() bool { return C.fpt_gate_enter() != 0 }

// leaveRound ends a round begun by enterRound.
func leaveRound() { C.fpt_gate_leave() }

// parkForExit blocks a socket-owning thread for the rest of the process's
// life: czmq's exit handler is closing its sockets.
func parkForExit() { select {} }
