package memcluster_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// round has every worker push its rank+1 into key 1 and pull the sum.
func round(c *memcluster.Cluster) error {
	for _, w := range c.Workers {
		kv := worker.NewKV[float32](w)
		if err := kv.Declare(1, 2, 0); err != nil {
			return err
		}
	}
	errs := make(chan error, len(c.Workers))
	for _, w := range c.Workers {
		go func() {
			kv := worker.NewKV[float32](w)
			ctx := context.Background()
			if err := kv.Init(ctx, []uint64{1}, []float32{0, 0}, nil); err != nil {
				errs <- err
				return
			}
			r := float32(w.Rank() + 1)
			if _, err := kv.FPTPush([]uint64{1}, []float32{r, 2 * r}, nil, 0, nil); err != nil {
				errs <- err
				return
			}
			sum := make([]float32, 2)
			ts, err := kv.FPTPull([]uint64{1}, sum, nil, nil)
			if err == nil {
				err = kv.Wait(ts)
			}
			if err == nil && (sum[0] != 3 || sum[1] != 6) {
				err = fmt.Errorf("worker %d pulled %v, want [3 6]", w.Rank(), sum)
			}
			errs <- err
		}()
	}
	for range c.Workers {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

// A cluster that finishes, and one that is closed after losing a node,
// leave no goroutine behind: the in-memory transports, every node and,
// with the LB on, every node's agent stop.
func TestNothingLeft(t *testing.T) {
	for _, lb := range []string{"off", "on"} {
		t.Run("LB "+lb, func(t *testing.T) {
			before := runtime.NumGoroutine()
			for _, drop := range []bool{false, true} {
				c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: 1, Workers: 2, Env: map[string]string{"FPT_LB": lb}})
				if err != nil {
					t.Fatal(err)
				}
				if err := round(c); err != nil {
					t.Fatal(err)
				}
				if drop {
					if err := c.Drop(node.WorkerID(1)); err != nil {
						t.Fatal(err)
					}
					c.Close()
				} else if err := c.Finish(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			// A lost peer's grace timer (cluster.lostPeerGrace) may still be
			// pending for a moment; everything else has returned.
			deadline := time.Now().Add(10 * time.Second)
			for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if g := runtime.NumGoroutine(); g > before {
				buf := make([]byte, 1<<20)
				t.Fatalf("%d goroutines left, %d before\n%s", g, before, buf[:runtime.Stack(buf, true)])
			}
		})
	}
}

func TestStartErrors(t *testing.T) {
	_, err := memcluster.Start(context.Background(), memcluster.Options{Servers: 1, Workers: 1, Env: map[string]string{"FPT_LB": "sideways"}})
	if err == nil || !strings.Contains(err.Error(), "FPT_LB") {
		t.Fatalf("a bad setting: %v", err)
	}
}
