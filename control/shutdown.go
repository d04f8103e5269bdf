package control

/*
#include <czmq.h>
*/
import "C"

// Shutdown terminates the process's ZeroMQ context, which waits (up to
// each socket's linger, 2 s) until messages already handed to closed
// sockets have left. A C program gets this from czmq's exit handler; a Go
// program's os.Exit skips it, and the last message (the scheduler's
// Terminate, a node's confirmation) would be lost. Call it once, at the end
// of the process, after every Plane is closed; no Plane can be made after.
func Shutdown() {
	zsysInit.Do(func() {}) // a process that never made a Plane has nothing to flush
	zap.shutdown()         // its socket must be gone before the context ends
	C.zsys_shutdown()
}
