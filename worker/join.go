package worker

import "errors"

// A worker may join a running job (started with the job's environment
// while it runs; the LB's grants must run: FPT_LB=on, FPT_ON_SERVER_LOSS=
// retry or FPT_ON_WORKER_LOSS=continue|wait). The scheduler admits it with
// a new id and an LB decision, taking effect at the first iteration no
// worker has pushed yet (J), whose Workers adds it: every sum from J on
// counts its pushes. Its program starts from the parameters the others
// have at the start of J. The library holds sums, not parameters, so a
// program that can be joined hands them over: SetParamsSource. On the
// joiner, Init returns them (in place of the init round, with no barrier)
// and its first push is of iteration J (StartIteration).

// ParamsSource copies the program's parameters of key into dst (exactly
// the key's declared bytes), as they are at the start of iteration (the
// values that iteration's gradients were computed from, before its sums
// are applied). An error is sent to the joining worker, which fails.
type ParamsSource func(iteration, key uint64, dst []byte) error

// errNoParamsSource is what a joining worker hears from a program that
// registered no ParamsSource.
var errNoParamsSource = errors.New("its program registered no parameters source (worker.SetParamsSource, fpt_set_params_source, fpt.set_params_source; fpt.torch registers the model's): a worker cannot join this job")

// SetParamsSource registers the source of the parameters a joining
// worker starts from. The worker that hands them over (the one with the
// lowest id among the workers of both J-1 and J) calls src once per
// declared key during its first FPTPush of iteration J, on the calling
// goroutine, before that push is sent: a program that pushes an
// iteration's gradients before applying its sums (every synchronous
// trainer does) still has the parameters of the start of J then. Set it
// before the first push; nil removes it.
func (w *Worker) SetParamsSource(src ParamsSource) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.params = src
}

// Joined reports whether this worker joined a running job (its node
// table said so), rather than starting with it.
func (w *Worker) Joined() bool { return w.node.Joined() }

// StartIteration is the iteration of this worker's first push after Init:
// 1 for a worker that started with the job (iteration 0 is the init
// round), J for one that joined it. On a joiner it is known once Init has
// returned (0 before).
func (w *Worker) StartIteration() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.startIteration()
}
