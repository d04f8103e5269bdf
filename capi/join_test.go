package capi

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
)

// trainJoinable trains a model of one key (n float32) on l to iteration
// iters, from its start iteration, as a C program would: its parameters
// start as Init's values and add every iteration's sums, and its source
// hands them over (returning status). at runs after each iteration. It
// returns the parameters' bytes.
func trainJoinable(l *Lib, rank, n, iters, status int, at func(it int)) ([]byte, error) {
	lens := []int{4 * n}
	keys := []uint64{1}
	if err := l.Declare(1, uint64(4*n), int(frame.Float32), 0); err != nil {
		return nil, err
	}
	params := make([]byte, 4*n)
	if err := l.SetParamsSource(func(_, key uint64, dst []byte) int {
		if key != 1 || len(dst) != len(params) {
			return 99
		}
		copy(dst, params)
		return status
	}); err != nil {
		return nil, err
	}
	for j := range f32s(params) {
		f32s(params)[j] = float32(j % 50)
	}
	if err := l.Init(Tensors{Keys: keys, Lens: lens, Data: params}); err != nil {
		return nil, err
	}
	start, err := l.StartIteration()
	if err != nil {
		return nil, err
	}
	grads, sums := make([]byte, 4*n), make([]byte, 4*n)
	for it := int(start); it <= iters; it++ {
		for j := range f32s(grads) {
			f32s(grads)[j] = float32((rank + it + j) % 7)
		}
		push, err := l.Push(Tensors{Keys: keys, Lens: lens, Data: grads}, 0, nil)
		if err != nil {
			return nil, err
		}
		pull, err := l.Pull(Tensors{Keys: keys, Lens: lens, Data: sums}, nil)
		if err != nil {
			return nil, err
		}
		for _, ts := range []int{push, pull} {
			if err := l.Wait(ts); err != nil {
				return nil, fmt.Errorf("rank %d iteration %d: %w", rank, it, err)
			}
		}
		for j, s := range f32s(sums) {
			f32s(params)[j] += s
		}
		at(it)
		time.Sleep(5 * time.Millisecond) // the forward pass: room for a join
	}
	return params, nil
}

// A worker started while a two-worker job trains joins it through the
// library: its Init returns the parameters the C program's source gave
// (no init round), its training starts at a later iteration, and it ends
// with the others' parameters. A source that returns non-zero fails the
// joiner, whose Init says the code, key and iteration.
func TestLibJoin(t *testing.T) {
	const n, iters = 1000, 40
	tests := []struct {
		name   string
		status int
		msg    string // "": the join succeeds
	}{
		{"parameters handed over", 0, ""},
		{"the source fails", 3, "fpt_params_fn returned 3 for key 1 at iteration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startLibsWith(t, 1, 2, func(_ string, vars map[string]string, _ *Lib) {
				vars["FPT_ON_WORKER_LOSS"] = "continue" // a failed joiner leaves; the others go on
				// The join lands 2 iterations past the latest done: with the
				// timed lookahead it lands up to FPT_LB_AHEAD of iterations
				// later, which may be past the job's end, and the others
				// wait for the joiner before they finalize.
				vars["FPT_LB_AHEAD"] = "0"
			})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			third := make(chan struct{})
			var once sync.Once
			params := make([][]byte, 3)
			errs := make([]error, 3)
			var wg sync.WaitGroup
			for r, l := range c.workers {
				wg.Go(func() {
					params[r], errs[r] = trainJoinable(l, r, n, iters, tt.status, func(it int) {
						if it == 3 {
							once.Do(func() { close(third) })
						}
					})
				})
			}
			<-third
			j := c.lib("worker")
			if err := j.Start(); err != nil {
				t.Fatalf("the third worker's Start: %v", err)
			}
			joined, err := j.Joined()
			if err != nil || !joined {
				t.Errorf("Joined = %v, %v; want true", joined, err)
			}
			params[2], errs[2] = trainJoinable(j, 2, n, iters, 0, func(int) {})
			wg.Wait()
			if tt.msg != "" {
				if CodeOf(errs[2]) != CodeCluster || !strings.Contains(errs[2].Error(), tt.msg) {
					t.Errorf("the joiner: %v (code %d), want CodeCluster containing %q", errs[2], CodeOf(errs[2]), tt.msg)
				}
				errs[2], params[2] = nil, params[0]
			}
			for r, err := range errs {
				if err != nil {
					t.Errorf("worker %d: %v", r, err)
				}
			}
			if tt.msg == "" {
				if it, err := j.StartIteration(); err != nil || it <= 3 || it > iters {
					t.Errorf("the joiner's StartIteration = %d, %v; want one in 4..%d", it, err, iters)
				}
				if !bytes.Equal(params[0], params[1]) || !bytes.Equal(params[0], params[2]) {
					t.Error("the three workers end with different parameters")
				}
			}
			c.workers = append(c.workers, j)
			done := make(chan []error, 1)
			go func() { done <- c.finalize() }()
			select {
			case errs := <-done:
				for i, err := range errs {
					if err != nil && !(tt.msg != "" && i == len(errs)-1) {
						t.Errorf("node %d: Finalize: %v", i, err)
					}
				}
			case <-ctx.Done():
				t.Fatal("Finalize hung")
			}
		})
	}
}
