package capi

import (
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/reduce"
)

// A compressed key (fpt_declare_wire) holds float32 values in the
// program's memory and travels as a 16-bit type: each call narrows the
// values into a buffer of half the size before it goes, and widens the
// sums back once they arrived. The worker and the aggregators only ever
// see the 16-bit key; aggregators sum 16-bit values in float32 and round
// the sum once.

// DeclareWire declares key as Declare does, its values of dtype travelling
// as wire: FPT_FLOAT16 or FPT_BFLOAT16 for float32 values (half the
// bytes), or 0 (or dtype itself) for no compression.
func (l *Lib) DeclareWire(key, bytes uint64, dtype, priority, wire int) error {
	const op = "fpt_declare_wire"
	if wire == 0 || wire == dtype {
		if err := l.Declare(key, bytes, dtype, priority); err != nil {
			return err
		}
		l.setWire(key, 0)
		return nil
	}
	wd := frame.DType(wire)
	if wire < 0 || (wd != frame.Float16 && wd != frame.BFloat16) {
		return fail(CodeArg, op, "key %d: wire dtype %d is none of FPT_FLOAT16 and FPT_BFLOAT16 (0: no compression)", key, wire)
	}
	if dtype != int(frame.Float32) {
		return fail(CodeArg, op, "key %d: a %s wire carries float32 values, the key holds dtype %d", key, wd, dtype)
	}
	if bytes%4 != 0 {
		return fail(CodeSize, op, "key %d: %d bytes is not a whole number of float32", key, bytes)
	}
	if err := l.Declare(key, bytes/2, wire, priority); err != nil {
		return err
	}
	l.setWire(key, wd)
	return nil
}

func (l *Lib) setWire(key uint64, wd frame.DType) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if wd == 0 {
		delete(l.wires, key)
		return
	}
	if l.wires == nil {
		l.wires = make(map[uint64]frame.DType)
	}
	l.wires[key] = wd
}

// wireCall is a call on compressed keys: the program's float32 tensors and
// the 16-bit ones that travel.
type wireCall struct {
	dt         frame.DType
	user, wire Tensors
	lib        *Lib
}

// wireOf is t's compressed counterpart, or nil when none of t's keys is
// compressed. A call mixing compressed keys with others, or two wire types,
// is refused: one call is one dtype.
func (l *Lib) wireOf(op string, t Tensors) (*wireCall, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.wires) == 0 || len(t.Keys) == 0 {
		return nil, nil
	}
	dt, ok := l.wires[t.Keys[0]]
	for _, k := range t.Keys[1:] {
		if d, o := l.wires[k]; d != dt || o != ok {
			return nil, fail(CodeArg, op, "keys %d and %d travel as %s and %s: one call takes keys of one wire type",
				t.Keys[0], k, wireName(dt), wireName(d))
		}
	}
	if !ok {
		return nil, nil
	}
	wc := &wireCall{dt: dt, user: t, wire: Tensors{Keys: t.Keys, Lens: make([]int, len(t.Lens))}}
	for i, n := range t.Lens {
		if n%4 != 0 {
			return nil, fail(CodeSize, op, "key %d: %d bytes is not a whole number of float32", t.Keys[i], n)
		}
		wc.wire.Lens[i] = n / 2
	}
	wc.wire.Data = l.stageBuffer(len(t.Data) / 2)
	wc.lib = l
	return wc, nil
}

// stageBuffer is a wire buffer of n bytes, one a finished call gave back
// if there is one: a training loop's calls reuse the same buffers.
func (l *Lib) stageBuffer(n int) []byte {
	l.stageMu.Lock()
	defer l.stageMu.Unlock()
	if free := l.staged[n]; len(free) > 0 {
		b := free[len(free)-1]
		l.staged[n] = free[:len(free)-1]
		return b
	}
	l.stageMade++
	return make([]byte, n)
}

// release gives the call's wire buffer back once the library is done with
// it (the request settled); wc must not be used after.
func (wc *wireCall) release() {
	l := wc.lib
	l.stageMu.Lock()
	defer l.stageMu.Unlock()
	if l.staged == nil {
		l.staged = make(map[int][][]byte)
	}
	l.staged[len(wc.wire.Data)] = append(l.staged[len(wc.wire.Data)], wc.wire.Data)
	wc.wire.Data = nil
}

func wireName(d frame.DType) string {
	if d == 0 {
		return "themselves"
	}
	return d.String()
}

// narrow encodes the program's values for the wire.
func (wc *wireCall) narrow() { reduce.Narrow(wc.dt, wc.wire.Data, wc.user.Data) }

// widen decodes what arrived into the program's memory.
func (wc *wireCall) widen() { reduce.Widen(wc.dt, wc.user.Data, wc.wire.Data) }

// then is cb after widening a successful pull (the program's memory holds
// the sums when cb runs and when fpt_wait returns) and giving the wire
// buffer back; for a push (widen false), after giving it back.
func (wc *wireCall) then(cb Callback, widen bool) Callback {
	return func(ts int, err error) {
		if err == nil && widen {
			wc.widen()
		}
		wc.release()
		if cb != nil {
			cb(ts, err)
		}
	}
}

// wireSource adapts a parameters source to compressed keys: the worker
// asks for the 16-bit values, the program's source gives float32.
func (l *Lib) wireSource(fn ParamsFn) ParamsFn {
	if fn == nil {
		return nil
	}
	return func(iteration, key uint64, dst []byte) int {
		l.mu.Lock()
		dt := l.wires[key]
		l.mu.Unlock()
		if dt == 0 {
			return fn(iteration, key, dst)
		}
		full := make([]byte, 2*len(dst))
		if st := fn(iteration, key, full); st != 0 {
			return st
		}
		reduce.Narrow(dt, dst, full)
		return 0
	}
}
