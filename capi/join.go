package capi

import (
	"fmt"

	"github.com/fptps/fpt/worker"
)

// A C program makes its worker joinable (worker.Worker.SetParamsSource):
// it registers a parameters source, a C function cmd/libfpt calls through
// a trampoline, and on a joiner asks where its training starts.

// ParamsFn is a C program's parameters source (fpt_params_fn): it copies
// key's parameters at the start of iteration into dst and returns 0, or a
// non-zero status it failed with.
type ParamsFn func(iteration, key uint64, dst []byte) int

// SetParamsSource registers fn as this worker's parameters source (nil
// removes it). Workers only, once started.
func (l *Lib) SetParamsSource(fn ParamsFn) error {
	w, err := l.worker("fpt_set_params_source")
	if err != nil {
		return err
	}
	w.SetParamsSource(paramsSource(l.wireSource(fn)))
	return nil
}

// paramsSource is fn as the worker calls it: a non-zero status is an
// error the joining worker is told, with the key and iteration.
func paramsSource(fn ParamsFn) worker.ParamsSource {
	if fn == nil {
		return nil
	}
	return func(iteration, key uint64, dst []byte) error {
		if status := fn(iteration, key, dst); status != 0 {
			return fmt.Errorf("capi: the program's fpt_params_fn returned %d for key %d at iteration %d", status, key, iteration)
		}
		return nil
	}
}

// StartIteration is the iteration of this worker's first push after
// Init (worker.Worker.StartIteration): 1, or on a joiner the iteration it
// joined at. Workers only, once started.
func (l *Lib) StartIteration() (uint64, error) {
	w, err := l.worker("fpt_start_iteration")
	if err != nil {
		return 0, err
	}
	return w.StartIteration(), nil
}

// Joined reports whether this worker joined a running job. Workers only,
// once started.
func (l *Lib) Joined() (bool, error) {
	w, err := l.worker("fpt_joined")
	if err != nil {
		return false, err
	}
	return w.Joined(), nil
}
