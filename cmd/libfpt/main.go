// Command libfpt is fpt's C library, the interface include/fpt.h
// documents, for programs in C and C++ such as MXNet's kvstore:
//
//	go build -buildmode=c-shared -o build/lib/libfpt.so ./cmd/libfpt
//
// (scripts/build-lib.sh also installs the header and a pkg-config file).
// A c-shared library must be package main; main never runs.
//
// This is the cgo shell over package capi, which holds the logic: each
// export turns C pointers into Go slices over the caller's memory (never
// copying a tensor), calls capi, and turns the result into a status code
// and this thread's last error. A recover in every export keeps a Go panic
// from crossing into C. cgo's pointer rules hold without pinning: the only
// Go pointer handed to C is an error message's bytes, for the duration of
// a call that copies them; C's pointers (tensors, user data, callbacks) are
// held by Go, which the rules allow, and user data only as an integer.
// A parameters source gets the destination of a key's parameters, which
// may be Go memory, as a call's argument (pinned for the call by cgo, and
// free of Go pointers). A customer's handler is the one exception: it reads a message's
// segments from Go memory, pinned (runtime.Pinner) for the call, through a
// segment array in Go memory that holds only those pinned pointers.
package main

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stdlib.h>
extern char **environ;
#include "shim.h"

// Const-qualified names for the exports' parameter types. cgo has no const,
// and with these the prototypes it generates match fpt.h's exactly; cgo
// compiles them in one unit with fpt.h, so any drift between the header
// and the exports below fails the build.
typedef const uint64_t fpt_const_u64;
typedef const void fpt_const_void;
typedef const fpt_msg_meta fpt_const_msg_meta;
typedef const fpt_segment fpt_const_segment;
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"unsafe"

	"github.com/fptps/fpt/appmsg"
	"github.com/fptps/fpt/capi"
	"github.com/fptps/fpt/control"
)

// lib is the process's node. The C interface, like ps-lite's process-wide
// Postoffice, has no handle for the caller to pass around, and a process
// can run only one node (one ZeroMQ context, shut down once), so it lives
// here; capi.Lib guards its own state with a mutex.
var lib = newLib()

func newLib() *capi.Lib {
	l := capi.New(getenv, environ, os.Stdout, os.Stderr, control.Shutdown)
	l.SetAllocator(capi.NewBlockCache(cAlloc{}))
	return l
}

func main() {}

// getenv reads the C environment when asked, rather than the copy Go took
// when the library was loaded, so that a program's setenv before fpt_start
// counts.
func getenv(name string) (string, bool) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	v := C.getenv(cs)
	if v == nil {
		return "", false
	}
	return C.GoString(v), true
}

// environ is the C environment's entries ("KEY=VALUE"), read when asked,
// as getenv reads them.
func environ() []string {
	var env []string
	for p := C.environ; p != nil && *p != nil; p = (**C.char)(unsafe.Add(unsafe.Pointer(p), unsafe.Sizeof(*p))) {
		env = append(env, C.GoString(*p))
	}
	return env
}

// guard runs an export's body: it sets the thread's last error from the
// outcome and returns the status code, turning a panic into
// FPT_ERR_INTERNAL instead of a crash of the C program.
func guard(op string, body func() error) (code C.int) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "libfpt: %s: panic: %v\n%s", op, r, debug.Stack())
			code = status(&capi.Error{Code: capi.CodeInternal, Err: fmt.Errorf("capi: %s: internal error (Go panic): %v", op, r)})
		}
	}()
	return status(body())
}

// status records err as the thread's last error ("" for success) and
// returns its code.
func status(err error) C.int {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	C.fpt_set_last_error(cstr(msg), C.size_t(len(msg)))
	return C.int(capi.CodeOf(err))
}

// cstr points at s's bytes for a C call that copies them (it is not
// NUL-terminated; the length goes along).
func cstr(s string) *C.char {
	return (*C.char)(unsafe.Pointer(unsafe.StringData(s)))
}

func nullArg(op, name string) error {
	return &capi.Error{Code: capi.CodeArg, Err: fmt.Errorf("capi: %s: %s is NULL", op, name)}
}

// intOut stores get's value through out.
func intOut(op string, out *C.int, get func() (int, error)) C.int {
	return guard(op, func() error {
		if out == nil {
			return nullArg(op, "the output pointer")
		}
		v, err := get()
		if err == nil {
			*out = C.int(v)
		}
		return err
	})
}

// callback wraps a C callback for capi; nil when the caller gave none.
func callback(cb C.fpt_callback, u C.uintptr_t) capi.Callback {
	if cb == nil {
		return nil
	}
	return func(ts int, err error) {
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		C.fpt_invoke(cb, C.int64_t(ts), C.int(capi.CodeOf(err)), cstr(msg), C.size_t(len(msg)), u)
	}
}

// userData is a caller's user data as the integer Go keeps it. It is
// often no pointer at all (Python's ctypes passes a request number), and
// a pointer-typed Go value under 4096 is fatal ("invalid pointer found on
// stack") when the goroutine's stack is copied, which any call may do.
// So the exports that take user data are nosplit (no stack check on
// entry, where every argument is live) and convert it before their one
// call: from then on no live variable of a pointer type holds it.
//
//go:nosplit
func userData(user unsafe.Pointer) C.uintptr_t { return C.uintptr_t(uintptr(user)) }

//export fpt_start
func fpt_start() C.int { return guard("fpt_start", lib.Start) }

//export fpt_start_customer
func fpt_start_customer(customerID C.int) C.int {
	return guard("fpt_start_customer", func() error { return lib.StartCustomer(int(customerID)) })
}

//export fpt_finalize
func fpt_finalize() C.int { return guard("fpt_finalize", lib.Finalize) }

//export fpt_role
func fpt_role(role *C.int) C.int {
	return intOut("fpt_role", role, func() (int, error) {
		r, err := lib.Role()
		return int(r), err
	})
}

//export fpt_rank
func fpt_rank(rank *C.int) C.int { return intOut("fpt_rank", rank, lib.Rank) }

//export fpt_num_workers
func fpt_num_workers(n *C.int) C.int { return intOut("fpt_num_workers", n, lib.NumWorkers) }

//export fpt_num_workers_at
func fpt_num_workers_at(iteration C.uint64_t, n *C.int) C.int {
	return intOut("fpt_num_workers_at", n, func() (int, error) { return lib.NumWorkersAt(uint64(iteration)) })
}

//export fpt_rank_at
func fpt_rank_at(iteration C.uint64_t, rank *C.int) C.int {
	return intOut("fpt_rank_at", rank, func() (int, error) { return lib.RankAt(uint64(iteration)) })
}

//export fpt_set_params_source
//go:nosplit
func fpt_set_params_source(fn C.fpt_params_fn, ctx unsafe.Pointer) C.int {
	return setParamsSource(fn, userData(ctx))
}

func setParamsSource(fn C.fpt_params_fn, u C.uintptr_t) C.int {
	return guard("fpt_set_params_source", func() error { return lib.SetParamsSource(paramsFn(fn, u)) })
}

// paramsFn wraps a C parameters source for capi; nil when the caller gave
// none. ctx travels as an integer, as callbacks' user data do (userData).
func paramsFn(fn C.fpt_params_fn, u C.uintptr_t) capi.ParamsFn {
	if fn == nil {
		return nil
	}
	return func(iteration, key uint64, dst []byte) int {
		var p unsafe.Pointer
		if len(dst) > 0 {
			p = unsafe.Pointer(unsafe.SliceData(dst))
		}
		return int(C.fpt_invoke_params(fn, u, C.uint64_t(iteration), C.uint64_t(key), p, C.uint64_t(len(dst))))
	}
}

//export fpt_start_iteration
func fpt_start_iteration(iteration *C.uint64_t) C.int {
	const op = "fpt_start_iteration"
	return guard(op, func() error {
		if iteration == nil {
			return nullArg(op, "the output pointer")
		}
		v, err := lib.StartIteration()
		if err == nil {
			*iteration = C.uint64_t(v)
		}
		return err
	})
}

//export fpt_joined
func fpt_joined(joined *C.int) C.int {
	return intOut("fpt_joined", joined, func() (int, error) {
		j, err := lib.Joined()
		if j {
			return 1, err
		}
		return 0, err
	})
}

//export fpt_num_servers
func fpt_num_servers(n *C.int) C.int { return intOut("fpt_num_servers", n, lib.NumServers) }

//export fpt_set_tensors_per_iteration
func fpt_set_tensors_per_iteration(n C.int) C.int {
	return guard("fpt_set_tensors_per_iteration", func() error { return lib.SetTensorsPerIteration(int(n)) })
}

//export fpt_declare
func fpt_declare(key, bytes C.uint64_t, dtype, priority C.int) C.int {
	return guard("fpt_declare", func() error {
		return lib.Declare(uint64(key), uint64(bytes), int(dtype), int(priority))
	})
}

//export fpt_declare_wire
func fpt_declare_wire(key, bytes C.uint64_t, dtype, priority, wire C.int) C.int {
	return guard("fpt_declare_wire", func() error {
		return lib.DeclareWire(uint64(key), uint64(bytes), int(dtype), int(priority), int(wire))
	})
}

//export fpt_init
func fpt_init(keys *C.fpt_const_u64, n C.size_t, vals unsafe.Pointer, lens *C.fpt_const_u64) C.int {
	const op = "fpt_init"
	return guard(op, func() error {
		t, err := capi.View(op, unsafe.Pointer(keys), uint64(n), vals, unsafe.Pointer(lens))
		if err != nil {
			return err
		}
		return lib.Init(t)
	})
}

//export fpt_broadcast
func fpt_broadcast(keys *C.fpt_const_u64, n C.size_t, vals unsafe.Pointer, lens *C.fpt_const_u64) C.int {
	const op = "fpt_broadcast"
	return guard(op, func() error {
		t, err := capi.View(op, unsafe.Pointer(keys), uint64(n), vals, unsafe.Pointer(lens))
		if err != nil {
			return err
		}
		return lib.Broadcast(t)
	})
}

//export fpt_push
//go:nosplit
func fpt_push(keys *C.fpt_const_u64, n C.size_t, vals *C.fpt_const_void, lens *C.fpt_const_u64,
	priority C.int, cb C.fpt_callback, user unsafe.Pointer, ts *C.int64_t) C.int {
	return push(keys, n, vals, lens, priority, cb, userData(user), ts)
}

func push(keys *C.fpt_const_u64, n C.size_t, vals *C.fpt_const_void, lens *C.fpt_const_u64,
	priority C.int, cb C.fpt_callback, u C.uintptr_t, ts *C.int64_t) C.int {
	const op = "fpt_push"
	return guard(op, func() error {
		t, err := capi.View(op, unsafe.Pointer(keys), uint64(n), unsafe.Pointer(vals), unsafe.Pointer(lens))
		if err != nil {
			return err
		}
		id, err := lib.Push(t, int(priority), callback(cb, u))
		if err == nil && ts != nil {
			*ts = C.int64_t(id)
		}
		return err
	})
}

//export fpt_push_pull
//go:nosplit
func fpt_push_pull(keys *C.fpt_const_u64, n C.size_t, vals *C.fpt_const_void, outs unsafe.Pointer,
	lens *C.fpt_const_u64, priority C.int, cb C.fpt_callback, user unsafe.Pointer, ts *C.int64_t) C.int {
	return pushPull(keys, n, vals, outs, lens, priority, cb, userData(user), ts)
}

func pushPull(keys *C.fpt_const_u64, n C.size_t, vals *C.fpt_const_void, outs unsafe.Pointer,
	lens *C.fpt_const_u64, priority C.int, cb C.fpt_callback, u C.uintptr_t, ts *C.int64_t) C.int {
	const op = "fpt_push_pull"
	return guard(op, func() error {
		t, err := capi.View(op, unsafe.Pointer(keys), uint64(n), unsafe.Pointer(vals), unsafe.Pointer(lens))
		if err != nil {
			return err
		}
		o := t.Data
		if outs == nil && len(t.Data) > 0 {
			return nullArg(op, "outs")
		}
		if outs != unsafe.Pointer(vals) {
			ot, err := capi.View(op, unsafe.Pointer(keys), uint64(n), outs, unsafe.Pointer(lens))
			if err != nil {
				return err
			}
			o = ot.Data
		}
		id, err := lib.PushPull(t, o, int(priority), callback(cb, u))
		if err == nil && ts != nil {
			*ts = C.int64_t(id)
		}
		return err
	})
}

//export fpt_pull
//go:nosplit
func fpt_pull(keys *C.fpt_const_u64, n C.size_t, vals unsafe.Pointer, lens *C.fpt_const_u64,
	cb C.fpt_callback, user unsafe.Pointer, ts *C.int64_t) C.int {
	return pull(keys, n, vals, lens, cb, userData(user), ts)
}

func pull(keys *C.fpt_const_u64, n C.size_t, vals unsafe.Pointer, lens *C.fpt_const_u64,
	cb C.fpt_callback, u C.uintptr_t, ts *C.int64_t) C.int {
	const op = "fpt_pull"
	return guard(op, func() error {
		t, err := capi.View(op, unsafe.Pointer(keys), uint64(n), vals, unsafe.Pointer(lens))
		if err != nil {
			return err
		}
		id, err := lib.Pull(t, callback(cb, u))
		if err == nil && ts != nil {
			*ts = C.int64_t(id)
		}
		return err
	})
}

// fpt_go_wait is fpt_wait's Go half (shim.c): the request's status, or
// FPT_WAIT_PENDING with w to be signalled by the goroutine that releases
// it (Lib.Notify), so that the waiting thread blocks and wakes in C.
//
//export fpt_go_wait
func fpt_go_wait(ts C.int64_t, w *C.fpt_waiter) C.int {
	pending := false
	status := guard("fpt_wait", func() error {
		done, err := lib.Notify(int(ts), func(err error) {
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			C.fpt_waiter_done(w, C.int(capi.CodeOf(err)), cstr(msg), C.size_t(len(msg)))
		})
		pending = !done
		return err
	})
	if pending {
		return C.FPT_WAIT_PENDING
	}
	return status
}

//export fpt_test
func fpt_test(ts C.int64_t, done *C.int) C.int {
	return guard("fpt_test", func() error {
		if done == nil {
			return nullArg("fpt_test", "done")
		}
		d, err := lib.Test(int(ts))
		if err != nil {
			return err
		}
		*done = 0
		if d {
			*done = 1
		}
		return nil
	})
}

//export fpt_barrier
func fpt_barrier() C.int { return guard("fpt_barrier", lib.Barrier) }

//export fpt_my_id
func fpt_my_id(id *C.int) C.int { return intOut("fpt_my_id", id, lib.MyID) }

//export fpt_group_ids
func fpt_group_ids(group C.int, ids *C.int, capacity C.size_t, n *C.size_t) C.int {
	const op = "fpt_group_ids"
	return guard(op, func() error {
		switch {
		case n == nil:
			return nullArg(op, "n")
		case ids == nil && capacity > 0:
			return &capi.Error{Code: capi.CodeArg, Err: fmt.Errorf("capi: %s: ids is NULL, cap is %d", op, capacity)}
		}
		got, err := lib.GroupIDs(int(group))
		if err != nil {
			return err
		}
		*n = C.size_t(len(got))
		if capacity > 0 {
			out := unsafe.Slice(ids, min(uint64(capacity), uint64(len(got))))
			for i := range out {
				out[i] = C.int(got[i])
			}
		}
		return nil
	})
}

//export fpt_barrier_group
func fpt_barrier_group(group C.int) C.int {
	return guard("fpt_barrier_group", func() error { return lib.BarrierGroup(int(group)) })
}

//export fpt_customer_add
//go:nosplit
func fpt_customer_add(app, cust C.int, handler C.fpt_msg_handler, user unsafe.Pointer) C.int {
	return customerAdd(app, cust, handler, userData(user))
}

func customerAdd(app, cust C.int, handler C.fpt_msg_handler, u C.uintptr_t) C.int {
	const op = "fpt_customer_add"
	return guard(op, func() error {
		if handler == nil {
			return nullArg(op, "handler")
		}
		return lib.CustomerAdd(int(app), int(cust), msgHandler(handler, u))
	})
}

//export fpt_customer_remove
func fpt_customer_remove(app, cust C.int) C.int {
	return guard("fpt_customer_remove", func() error { return lib.CustomerRemove(int(app), int(cust)) })
}

//export fpt_msg_send
func fpt_msg_send(meta *C.fpt_const_msg_meta, segs *C.fpt_const_segment, n C.size_t) C.int {
	const op = "fpt_msg_send"
	return guard(op, func() error {
		switch {
		case meta == nil:
			return nullArg(op, "meta")
		case n > capi.MaxSegments:
			return &capi.Error{Code: capi.CodeArg, Err: fmt.Errorf("capi: %s: %d segments (at most FPT_MSG_MAX_SEGMENTS, %d)", op, n, capi.MaxSegments)}
		case segs == nil && n > 0:
			return &capi.Error{Code: capi.CodeArg, Err: fmt.Errorf("capi: %s: segs is NULL, num_segs is %d", op, n)}
		}
		cs := unsafe.Slice((*C.fpt_segment)(unsafe.Pointer(segs)), n)
		views := make([][]byte, n)
		for i, s := range cs {
			v, err := capi.Segment(op, i, unsafe.Pointer(s.data), uint64(s.bytes))
			if err != nil {
				return err
			}
			views[i] = v
		}
		m := (*C.fpt_msg_meta)(unsafe.Pointer(meta))
		return lib.MsgSend(capi.Msg{
			App: int32(m.app_id), Customer: int32(m.customer_id), Timestamp: int32(m.timestamp), Head: int32(m.head),
			Recipient: int32(m.recipient), Flags: uint32(m.flags), DType: int32(m.dtype), Priority: int32(m.priority),
		}, views)
	})
}

//export fpt_customer_add_keep
func fpt_customer_add_keep(app, cust C.int, handler C.fpt_msg_keep_handler, user unsafe.Pointer) C.int {
	const op = "fpt_customer_add_keep"
	u := userData(user)
	return guard(op, func() error {
		if handler == nil {
			return nullArg(op, "handler")
		}
		return lib.CustomerAddKeep(int(app), int(cust), keepHandler(handler, u))
	})
}

//export fpt_msg_release
func fpt_msg_release(block unsafe.Pointer) {
	if block == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "libfpt: fpt_msg_release: panic: %v\n%s", r, debug.Stack())
		}
	}()
	lib.ReleaseBlock(unsafe.Slice((*byte)(block), 1))
}

// cAlloc is the raw memory of the blocks customer messages are read into:
// C memory (malloc), behind the node's capi.BlockCache, to which a
// keeping handler gives a block back with fpt_msg_release whenever it is
// done with it, on any thread.
type cAlloc struct{}

func (cAlloc) Alloc(n int) []byte {
	p := C.malloc(C.size_t(n))
	if p == nil {
		// Go memory here would later be given to free().
		panic(fmt.Sprintf("libfpt: malloc of %d bytes for a customer message failed", n))
	}
	return unsafe.Slice((*byte)(p), n)
}

func (cAlloc) Free(b []byte) { C.free(unsafe.Pointer(unsafe.SliceData(b))) }

// msgSegs is a message's meta and segments for C. Segments in Go memory
// are pinned for the call (the array then holds pinned pointers only, as
// cgo's rules require); an empty segment is NULL.
func msgSegs(m *appmsg.Message, pin *runtime.Pinner) (C.fpt_msg_meta, [capi.MaxSegments]C.fpt_segment, int) {
	meta := C.fpt_msg_meta{
		app_id: C.int32_t(m.Meta.App), customer_id: C.int32_t(m.Meta.Customer),
		timestamp: C.int32_t(m.Meta.Timestamp), head: C.int32_t(m.Meta.Head),
		sender: C.int32_t(m.Meta.Sender), recipient: C.int32_t(m.Meta.Recipient),
		flags: C.uint32_t(m.Meta.Flags), dtype: C.int32_t(m.Meta.DType), priority: C.int32_t(m.Meta.Priority),
	}
	var segs [capi.MaxSegments]C.fpt_segment
	n := min(len(m.Segments), capi.MaxSegments)
	for i, s := range m.Segments[:n] {
		if len(s) == 0 {
			continue
		}
		p := unsafe.Pointer(unsafe.SliceData(s))
		if m.Buffer == nil {
			pin.Pin(p)
		}
		segs[i] = C.fpt_segment{data: p, bytes: C.uint64_t(len(s))}
	}
	return meta, segs, n
}

// keepHandler wraps a keeping C handler for capi: a message in C memory
// (m.Buffer) is handed over with its block, NULL otherwise.
func keepHandler(h C.fpt_msg_keep_handler, user C.uintptr_t) capi.MsgHandler {
	return func(m *appmsg.Message, err error) {
		var pin runtime.Pinner
		defer pin.Unpin()
		meta, segs, n := msgSegs(m, &pin)
		var block unsafe.Pointer
		if m.Buffer != nil {
			block = unsafe.Pointer(unsafe.SliceData(m.Buffer))
		}
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		C.fpt_invoke_msg_keep(h, &meta, &segs[0], C.size_t(n), block, cstr(msg), C.size_t(len(msg)), user)
	}
}

// msgHandler wraps a C customer handler for capi. Each call hands C the
// meta and a segment array in Go memory, the segments' bytes pinned for
// the call (the array then holds pinned pointers only, as cgo's rules
// require); an empty segment is NULL.
func msgHandler(h C.fpt_msg_handler, user C.uintptr_t) capi.MsgHandler {
	return func(m *appmsg.Message, err error) {
		var pin runtime.Pinner
		defer pin.Unpin()
		meta, segs, n := msgSegs(m, &pin)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		C.fpt_invoke_msg(h, &meta, &segs[0], C.size_t(n), cstr(msg), C.size_t(len(msg)), user)
	}
}
