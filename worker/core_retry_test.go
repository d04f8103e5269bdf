package worker

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// The core under FPT_ON_SERVER_LOSS=retry: pushes held until every worker
// has the sums, the retry decision that re-cuts iterations after a lost
// server, and the results it makes stale.

// retryCore is worker rank's core in retry mode, 2 servers, with the
// horizon open and key 5 (64 bytes: 4 partitions, 2 per server) declared.
func retryCore(t *testing.T, rank int) *core {
	t.Helper()
	c := startedCore(t, rank, 2, true)
	c.retryMode = true
	if _, _, err := c.follow(lb.Directive{Horizon: 100}); err != nil {
		t.Fatal(err)
	}
	mustDeclare(t, c, 5, 64)
	return c
}

// lose0 is the retry decision after server 0's loss, from iteration from.
func lose0(from uint64) lb.Directive {
	d := lb.Even(1, from, []node.ID{node.ServerID(1)})
	return lb.Directive{Horizon: 100, Decision: &d, Retry: true, Done: from}
}

// versioned are the Result frames of key 5's iteration iter under the
// decision in force then, stamped with its version as aggregators do.
func versioned(c *core, iter uint64) []frame.Header {
	hs := results(c, 5, iter)
	for i := range hs {
		hs[i].Aux = c.schedule.At(iter).Version
	}
	return hs
}

// deliver lands every frame of hs with its bytes of sum, and returns what
// the last landing did.
func deliver(t *testing.T, c *core, hs []frame.Header, sum []byte) effects {
	t.Helper()
	var out effects
	for i := range hs {
		h := &hs[i]
		td, err := receive(c, h, sum[h.Offset:h.Offset+h.Length])
		if err != nil {
			t.Fatalf("result %s: %v", h, err)
		}
		out.merge(td)
	}
	return out
}

// initRound pushes and pulls key 5's iteration 0 on c, with its sum.
func initRound(t *testing.T, c *core) {
	t.Helper()
	handOver(c, mustPush(t, c, 5, pattern(64, 0)))
	deliver(t, c, versioned(c, 0), pattern(64, 0))
	pull, err := c.pull([]uint64{5}, make([]byte, 64), []int{64}, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}
	handOver(c, pull)
	for _, d := range pull.copies {
		copyStaged(c, d)
	}
}

// A push completes once the LB's Done passes its iteration, not when its
// frames are written: until then a retry may need its values.
func TestCoreRetryHoldsPushes(t *testing.T) {
	c := retryCore(t, 0)
	td := mustPush(t, c, 5, pattern(64, 0))
	if td.began != nil {
		t.Errorf("a push reported iteration %d to the LB; under retry completions are reported", td.began.iter)
	}
	if fin := handOver(c, td); len(fin) != 0 {
		t.Fatalf("push finished when its frames were written: %v", fin)
	}
	out, _, err := c.follow(lb.Directive{Horizon: 100, Done: 0})
	if err != nil || len(out.finished) != 0 {
		t.Fatalf("Done 0: finished %v, err %v", finishedTS(out), err)
	}
	out, _, err = c.follow(lb.Directive{Horizon: 100, Done: 1})
	if err != nil || !slices.Equal(finishedTS(out), []int{td.req.ts}) {
		t.Fatalf("Done 1: finished %v, err %v; want the push", finishedTS(out), err)
	}
	if len(c.held) != 0 {
		t.Errorf("%d pushes still held", len(c.held))
	}
}

// The retry decision re-cuts the held pushes of its iteration and later,
// over the servers left, with the caller's values and the new version;
// earlier iterations are not sent again.
func TestCoreRetryPushesAgain(t *testing.T) {
	c := retryCore(t, 1)
	var pushes []effects
	for it := range uint64(3) {
		td := mustPush(t, c, 5, pattern(64, it))
		handOver(c, td)
		pushes = append(pushes, td)
	}
	out, _, err := c.follow(lose0(1))
	if err != nil {
		t.Fatal(err)
	}
	// The retry's Done (1) releases iteration 0's push.
	if got := finishedTS(out); !slices.Equal(got, []int{pushes[0].req.ts}) {
		t.Fatalf("the retry finished %v, want iteration 0's push", got)
	}
	// Rank 1 sends nothing in the init round: iterations 1 and 2 only.
	if len(out.resends) != 2 {
		t.Fatalf("%d pushes sent again, want 2 (iterations 1 and 2)", len(out.resends))
	}
	for i, rs := range out.resends {
		it := uint64(i + 1)
		if rs.req != pushes[it].req || len(rs.locals) != 0 {
			t.Fatalf("resend %d: request %d, %d locals", i, rs.req.ts, len(rs.locals))
		}
		var got []byte
		for _, m := range rs.sends {
			h := m.Header
			if node.ID(h.Recipient) != node.ServerID(1) || h.Aux != 1 || h.Iteration != it || h.Type != frame.Push {
				t.Errorf("iteration %d: frame %s, want a push to %s under v1", it, &h, node.ServerID(1))
			}
			got = append(got, m.Payload...)
		}
		if !bytes.Equal(got, pattern(64, it)) {
			t.Errorf("iteration %d: sent again %v, want the pushed values", it, got)
		}
		// The frames sent again must be written before the push completes.
		for range rs.sends {
			c.sent(rs.req, nil)
		}
	}
	out, _, err = c.follow(lb.Directive{Horizon: 100, Done: 3})
	if err != nil || len(out.finished) != 2 {
		t.Fatalf("Done 3: finished %v, err %v; want the pushes of iterations 1 and 2", finishedTS(out), err)
	}
	// A retry from an iteration every worker has the sums of is a bug.
	if _, _, err := c.follow(lose0(2)); err == nil {
		t.Error("a second retry from iteration 2 (below Done 3) was accepted")
	}
}

// Results across a retry: a result in progress starts again under the new
// layout; frames of the replaced cut, and second copies of sums already
// complete, are dropped, never summed or counted twice.
func TestCoreRetryResults(t *testing.T) {
	tests := []struct {
		name string
		// before: old-cut frames of iteration 1 landed before the retry
		// (indices into its 4 partitions); all: the result was complete.
		before []int
		pulled bool // the pull was made (and, if complete, delivered) before the retry
	}{
		{"nothing arrived", nil, false},
		{"half arrived, pull waiting", []int{0, 1}, true},
		{"half arrived, no pull yet", []int{2, 3}, false},
		{"complete, not pulled", []int{0, 1, 2, 3}, false},
		{"complete and pulled", []int{0, 1, 2, 3}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := retryCore(t, 0)
			initRound(t, c)
			handOver(c, mustPush(t, c, 5, pattern(64, 1)))
			sum := pattern(64, 9)
			old := versioned(c, 1)
			dst := make([]byte, 64)
			var pull effects
			if tt.pulled {
				var err error
				if pull, err = c.pull([]uint64{5}, dst, []int{64}, frame.Float32, &call{}); err != nil {
					t.Fatal(err)
				}
			}
			var landed effects
			for _, i := range tt.before {
				td, err := receive(c, &old[i], sum[old[i].Offset:old[i].Offset+old[i].Length])
				if err != nil {
					t.Fatal(err)
				}
				landed.merge(td)
			}
			complete := len(tt.before) == 4
			if _, _, err := c.follow(lose0(1)); err != nil {
				t.Fatal(err)
			}
			// The rest of the replaced cut arrives late: dropped.
			for i := range old {
				if slices.Contains(tt.before, i) {
					continue
				}
				if _, _, err := c.received(&old[i]); !errors.Is(err, errStale) {
					t.Fatalf("old-cut partition %d after the retry: err %v, want errStale", i, err)
				}
			}
			fresh := versioned(c, 1)
			if len(fresh) != 4 || node.ID(fresh[0].Sender) != node.ServerID(1) || fresh[0].Aux != 1 {
				t.Fatalf("new cut: %d partitions from %d under v%d", len(fresh), fresh[0].Sender, fresh[0].Aux)
			}
			if complete {
				for i := range fresh {
					if _, _, err := c.received(&fresh[i]); !errors.Is(err, errStale) {
						t.Fatalf("second copy of partition %d of a complete sum: err %v, want errStale", i, err)
					}
				}
			} else {
				landed.merge(deliver(t, c, fresh, sum))
			}
			if !tt.pulled {
				var err error
				if pull, err = c.pull([]uint64{5}, dst, []int{64}, frame.Float32, &call{}); err != nil {
					t.Fatal(err)
				}
			}
			landed.merge(effects{finished: pull.finished})
			landed.merge(c.handedOver(pull.req, nil))
			pull.finished = nil
			for _, d := range pull.copies {
				landed.merge(copyStaged(c, d))
			}
			var done bool
			for _, r := range slices.Concat(pull.finished, landed.finished) {
				done = done || r == pull.req
			}
			if !done {
				t.Fatal("the pull of iteration 1 did not complete")
			}
			if !bytes.Equal(dst, sum) {
				t.Errorf("pulled %v, want %v", dst, sum)
			}
		})
	}
}

// A pull into its own push's buffer is held until the push completes: the
// sums would overwrite the values a retry pushes again.
func TestCoreRetryInPlacePull(t *testing.T) {
	c := retryCore(t, 0)
	initRound(t, c)
	buf := pattern(64, 1)
	push := mustPush(t, c, 5, buf)
	handOver(c, push)
	pull, err := c.pull([]uint64{5}, buf, []int{64}, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}
	handOver(c, pull)
	sum := pattern(64, 9)
	landed := deliver(t, c, versioned(c, 1), sum)
	if landed.began == nil || landed.began.iter != 2 {
		t.Errorf("the last partition reported %+v to the LB, want iteration 1 complete (began 2)", landed.began)
	}
	if len(landed.finished) != 0 || len(pull.finished) != 0 || !bytes.Equal(buf, pattern(64, 1)) {
		t.Fatalf("the sums reached the push's buffer before the push completed: finished %v", finishedTS(landed))
	}
	out, _, err := c.follow(lb.Directive{Horizon: 100, Done: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range out.copies {
		out.merge(copyStaged(c, d))
	}
	if got := finishedTS(out); !slices.Contains(got, push.req.ts) || !slices.Contains(got, pull.req.ts) {
		t.Fatalf("Done 2 finished %v, want the push %d and the pull %d", got, push.req.ts, pull.req.ts)
	}
	if !bytes.Equal(buf, sum) {
		t.Errorf("pulled %v, want %v", buf, sum)
	}
}

// sinkThenRetry is worker 0's core with iteration 1 of key 5 pushed and
// pulled into dst, partition part of its result (old, the frames of the
// cut before the retry) claimed by the sink into span, then server 0's
// loss re-cutting iteration 1.
func sinkThenRetry(t *testing.T, part int) (c *core, dst []byte, pull effects, old []frame.Header, span []byte) {
	t.Helper()
	c = retryCore(t, 0)
	initRound(t, c)
	handOver(c, mustPush(t, c, 5, pattern(64, 1)))
	dst = make([]byte, 64)
	pull, err := c.pull([]uint64{5}, dst, []int{64}, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}
	handOver(c, pull)
	old = versioned(c, 1)
	if span = c.sink(&old[part]); span == nil {
		t.Fatal("the sink refused an expected partition")
	}
	if _, _, err := c.follow(lose0(1)); err != nil {
		t.Fatal(err)
	}
	return c, dst, pull, old, span
}

// A partition the van was reading in place when the retry came lands
// after it: it no longer counts, so the result completes with the new
// cut's last partition, not one early.
func TestCoreRetryLandingInFlight(t *testing.T) {
	c, dst, pull, old, span := sinkThenRetry(t, 0)
	sum := pattern(64, 9)
	copy(span, sum[old[0].Offset:old[0].Offset+old[0].Length])
	l, inPlace, err := c.received(&old[0])
	if err != nil || !inPlace {
		t.Fatalf("the landing in flight: in place %v, err %v", inPlace, err)
	}
	if fin := finishedTS(c.land(l, old[0].Partition)); len(fin) != 0 {
		t.Fatalf("the old cut's landing finished %v", fin)
	}
	fresh := versioned(c, 1)
	for i := range fresh {
		h := &fresh[i]
		td, err := receive(c, h, sum[h.Offset:h.Offset+h.Length])
		if err != nil {
			t.Fatal(err)
		}
		if done := slices.Contains(finishedTS(td), pull.req.ts); done != (i == len(fresh)-1) {
			t.Fatalf("new-cut partition %d of %d: pull finished %v", i+1, len(fresh), done)
		}
	}
	if !bytes.Equal(dst, sum) {
		t.Errorf("pulled %v, want %v", dst, sum)
	}
}

// A partition the van was reading in place into the pull's buffer when
// the retry came, whose last bytes arrive after the new cut's partitions
// covering them (another connection): the new cut is staged apart until
// the old landing ends, or those bytes would overwrite the new sum.
func TestCoreRetryLandingOutlivesNewCut(t *testing.T) {
	for _, lost := range []bool{false, true} {
		name := "lands"
		if lost {
			name = "connection lost"
		}
		t.Run(name, func(t *testing.T) {
			c, dst, pull, old, span := sinkThenRetry(t, 2)
			sum := pattern(64, 9)
			var out effects
			for _, h := range versioned(c, 1) {
				td, err := receive(c, &h, sum[h.Offset:h.Offset+h.Length])
				if err != nil {
					t.Fatal(err)
				}
				if fin := finishedTS(td); len(fin) != 0 {
					t.Fatalf("the new cut finished %v while the old landing was still written", fin)
				}
				out.merge(td)
			}
			for i := range span {
				span[i] = 0xEE // the old cut's sum, a different one
			}
			if lost {
				out = c.abandon(node.ID(old[2].Sender))
			} else {
				l, inPlace, err := c.received(&old[2])
				if err != nil || !inPlace {
					t.Fatalf("the landing in flight: in place %v, err %v", inPlace, err)
				}
				out = c.land(l, old[2].Partition)
			}
			for len(out.copies) > 0 {
				d := out.copies[0]
				out.copies = out.copies[1:]
				out.merge(copyStaged(c, d))
			}
			if !slices.Contains(finishedTS(out), pull.req.ts) {
				t.Fatalf("the pull did not complete: finished %v", finishedTS(out))
			}
			if !bytes.Equal(dst, sum) {
				t.Errorf("pulled %v, want %v", dst, sum)
			}
		})
	}
}

// A retry while the pull copies the partitions staged before it: the new
// cut's partitions may overlap the ones being copied, so they are staged
// apart and copied once that copy is over.
func TestCoreRetryDuringStagedCopy(t *testing.T) {
	c := retryCore(t, 0)
	initRound(t, c)
	handOver(c, mustPush(t, c, 5, pattern(64, 1)))
	sum := pattern(64, 9)
	old := versioned(c, 1)
	for _, i := range []int{0, 1} {
		if _, err := receive(c, &old[i], sum[old[i].Offset:old[i].Offset+old[i].Length]); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]byte, 64)
	pull, err := c.pull([]uint64{5}, dst, []int{64}, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}
	handOver(c, pull)
	if len(pull.copies) != 1 {
		t.Fatalf("%d copies of staged partitions, want 1", len(pull.copies))
	}
	copying := pull.copies[0]
	if _, _, err := c.follow(lose0(1)); err != nil {
		t.Fatal(err)
	}
	fresh := versioned(c, 1)
	for i := range fresh {
		l, _, err := c.received(&fresh[i])
		if err != nil {
			t.Fatal(err)
		}
		if !l.staging {
			t.Fatalf("new-cut partition %d lands in the pull's buffer while staged bytes are copied into it", i)
		}
		copy(l.span, sum[fresh[i].Offset:fresh[i].Offset+fresh[i].Length])
		if fin := finishedTS(c.land(l, fresh[i].Partition)); len(fin) != 0 {
			t.Fatalf("finished %v during the copy", fin)
		}
	}
	out := copyStaged(c, copying)
	if len(out.copies) != 1 {
		t.Fatalf("after the copy: %d further copies, want 1 (the new cut's staged partitions)", len(out.copies))
	}
	out = copyStaged(c, out.copies[0])
	if !slices.Contains(finishedTS(out), pull.req.ts) {
		t.Fatalf("the pull did not complete: finished %v", finishedTS(out))
	}
	if !bytes.Equal(dst, sum) {
		t.Errorf("pulled %v, want %v", dst, sum)
	}
}

// Directives reach the worker from the moment its node has a table,
// before the worker has its schedule (a server lost during the start,
// a decision issued early): start applies them in order.
func TestCoreDirectivesBeforeStart(t *testing.T) {
	c := newCore(testPartBytes, true)
	c.retryMode = true
	servers := []node.ID{node.ServerID(0), node.ServerID(1)}
	dec := lb.Even(1, 3, servers)
	retry := lose0(0)
	retry.Decision.Version = 2
	for _, d := range []lb.Directive{{Horizon: 2}, {Horizon: 2, Decision: &dec}, retry} {
		if _, _, err := c.follow(d); err != nil {
			t.Fatalf("directive %s before start: %v", d, err)
		}
	}
	if err := c.start(node.WorkerID(0), servers, testWorkers(2)); err != nil {
		t.Fatal(err)
	}
	if v := c.decisionVersion(); v != 2 {
		t.Errorf("after start: decision v%d, want v2 (the retry, which replaced v1)", v)
	}
	if got := c.schedule.At(5).Aggregators; !slices.Equal(got, []node.ID{node.ServerID(1)}) {
		t.Errorf("iteration 5 goes to %v, want server 1 only", got)
	}
}

// loseWorker1 is the retry decision after worker 1's loss (2 servers
// still), from iteration from: the sums from then on add up worker 0's
// pushes only.
func loseWorker1(from uint64) lb.Directive {
	d := lb.Even(1, from, []node.ID{node.ServerID(0), node.ServerID(1)})
	d.Workers = []node.ID{node.WorkerID(0)}
	return lb.Directive{Horizon: 100, Decision: &d, Retry: true, Done: from}
}

// Under FPT_ON_WORKER_LOSS=continue a lost worker's retry changes the
// sums of the iterations it covers, complete ones too, so a pull completes
// only once every worker has its iteration's sum: whenever the sum over
// both workers arrived (before the pull, after it, half of it), the pull
// completes with the re-summed values, and only at Done.
func TestCoreResumRetry(t *testing.T) {
	tests := []struct {
		name       string
		before     []int // old-sum partitions of iteration 1 landed before the retry
		pullBefore bool  // the pull was made before the retry
	}{
		{"nothing arrived", nil, true},
		{"half arrived, pull waiting", []int{1, 3}, true},
		{"complete, pull waiting (held)", []int{0, 1, 2, 3}, true},
		{"complete, no pull yet", []int{0, 1, 2, 3}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := retryCore(t, 0)
			c.sumsAgainOnWorkerLoss = true
			initRound(t, c)
			if _, _, err := c.follow(lb.Directive{Horizon: 100, Done: 1}); err != nil {
				t.Fatal(err)
			}
			handOver(c, mustPush(t, c, 5, pattern(64, 1)))
			old, both, alone := versioned(c, 1), pattern(64, 9), pattern(64, 1)
			dst := make([]byte, 64)
			var finished []int
			var began *iterationBegan
			var note func(effects)
			note = func(td effects) {
				finished = append(finished, finishedTS(td)...)
				if td.began != nil {
					began = td.began
				}
				for _, d := range td.copies {
					note(copyStaged(c, d))
				}
			}
			// pull makes the FPTPull, as the shell does: its hand-over, and
			// the copies of what was staged.
			pull := func() *request {
				td, err := c.pull([]uint64{5}, dst, []int{64}, frame.Float32, &call{})
				if err != nil {
					t.Fatal(err)
				}
				finished = append(finished, handOver(c, td)...)
				for _, d := range td.copies {
					note(copyStaged(c, d))
				}
				return td.req
			}
			var req *request
			if tt.pullBefore {
				req = pull()
			}
			for _, i := range tt.before {
				td, err := receive(c, &old[i], both[old[i].Offset:old[i].Offset+old[i].Length])
				if err != nil {
					t.Fatal(err)
				}
				note(td)
			}
			if len(tt.before) == 4 && (began == nil || began.iter != 2 || began.version != 0) {
				t.Fatalf("the sum over both workers reported %+v, want iteration 1 done under version 0", began)
			}
			out, _, err := c.follow(loseWorker1(1))
			if err != nil {
				t.Fatal(err)
			}
			note(out)
			if !tt.pullBefore {
				req = pull()
			}
			if slices.Contains(finished, req.ts) {
				t.Fatal("the pull completed with the sum over both workers")
			}
			began = nil
			note(deliver(t, c, versioned(c, 1), alone))
			if began == nil || began.iter != 2 || began.version != 1 {
				t.Fatalf("the re-sum reported %+v, want iteration 1 done under version 1", began)
			}
			if slices.Contains(finished, req.ts) {
				t.Fatal("the pull completed before every worker had the sum (Done 1)")
			}
			out, _, err = c.follow(lb.Directive{Horizon: 100, Done: 2})
			if err != nil {
				t.Fatal(err)
			}
			note(out)
			if !slices.Contains(finished, req.ts) {
				t.Fatal("Done 2 did not complete the pull")
			}
			if !bytes.Equal(dst, alone) {
				t.Errorf("pulled %v, want worker 0's sum alone %v", dst, alone)
			}
			if got := c.workersAt(1); !slices.Equal(got, []node.ID{node.WorkerID(0)}) {
				t.Errorf("workersAt(1) = %v, want [%s]", got, node.WorkerID(0))
			}
			if got := c.workersAt(0); !slices.Equal(got, testWorkers(2)) {
				t.Errorf("workersAt(0) = %v, want both workers", got)
			}
		})
	}
}

// A decision that changes the workers is refused where
// FPT_ON_WORKER_LOSS is not continue: that node's sums would differ from
// the others'.
func TestCoreResumNeedsContinue(t *testing.T) {
	c := retryCore(t, 0)
	if _, _, err := c.follow(loseWorker1(1)); err == nil {
		t.Fatal("a retry changing the workers was followed without FPT_ON_WORKER_LOSS=continue")
	}
}

// Keys initialised by Broadcast (fpt.torch's broadcast keys) have their
// init round only: the iterations after it complete without them, where
// they would wait for them for ever, and pushing one is an error.
func TestCoreBroadcastKeys(t *testing.T) {
	c := retryCore(t, 0) // key 5 declared
	mustDeclare(t, c, 6, 64)
	for _, key := range []uint64{5, 6} {
		handOver(c, mustPush(t, c, key, pattern(64, 0)))
	}
	reported := func(td effects) uint64 {
		if td.began == nil {
			return 0
		}
		return td.began.iter
	}
	deliverKey := func(key, iter uint64) effects {
		t.Helper()
		hs := results(c, key, iter)
		var out effects
		for i := range hs {
			hs[i].Aux = c.schedule.At(iter).Version
			td, err := receive(c, &hs[i], make([]byte, hs[i].Length))
			if err != nil {
				t.Fatal(err)
			}
			out.merge(td)
		}
		return out
	}
	if got := reported(deliverKey(5, 0)); got != 0 {
		t.Fatalf("the init round reported complete (%d) without key 6's sum", got)
	}
	if got := reported(deliverKey(6, 0)); got != 1 {
		t.Fatalf("the init round's last sum reported %d, want 1", got)
	}
	c.broadcastOnly([]uint64{6})
	handOver(c, mustPush(t, c, 5, pattern(64, 1)))
	if got := reported(deliverKey(5, 1)); got != 2 {
		t.Fatalf("iteration 1's sum of key 5 reported %d, want 2: key 6 was broadcast", got)
	}
	if got := c.iterationsPushed(); got != 2 {
		t.Errorf("iterations pushed %d, want 2: key 6 was broadcast", got)
	}
	if _, err := c.push([]uint64{6}, pattern(64, 1), []int{64}, frame.Float32, 0, &call{}); err == nil || !strings.Contains(err.Error(), "was broadcast") {
		t.Errorf("a push of the broadcast key: %v, want refused", err)
	}
}

// A pull into its own push's buffer under retry (Init's) is deferred
// until the LB's Done passes its iteration (the buffer holds the values a
// retry pushes again), but Done passing it does not mean every partition
// is here: a worker reports an iteration complete over the keys it
// pushed, so with keys initialised apart Done passes the init round while
// another key's sum is still on its way. The pull completes with its
// last partition, which lands in its buffer, not refused as a result of
// an iteration pulled already.
func TestCoreDeferredPullWaitsForItsSum(t *testing.T) {
	c := retryCore(t, 1) // key 5 declared
	mustDeclare(t, c, 6, 64)
	keyed := func(key, iter uint64) []frame.Header {
		hs := results(c, key, iter)
		for i := range hs {
			hs[i].Aux = c.schedule.At(iter).Version
		}
		return hs
	}
	buf := make([]byte, 128)
	keys, lens := []uint64{5, 6}, []int{64, 64}
	push, err := c.push(keys, buf, lens, frame.Float32, 0, &call{})
	if err != nil {
		t.Fatal(err)
	}
	handOver(c, push)
	pp, err := c.pull(keys, buf, lens, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}
	if fin := handOver(c, pp); len(fin) != 0 {
		t.Fatalf("Init's pull finished when handed over: %v", fin)
	}
	deliver(t, c, keyed(5, 0), pattern(64, 0))
	out, _, err := c.follow(lb.Directive{Horizon: 100, Done: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range out.copies {
		out.merge(copyStaged(c, d))
	}
	if slices.Contains(finishedTS(out), pp.req.ts) {
		t.Fatal("Init's pull finished on Done 1 without key 6's sum")
	}
	landed := deliver(t, c, keyed(6, 0), pattern(64, 3))
	if !slices.Contains(finishedTS(landed), pp.req.ts) {
		t.Fatalf("Init's pull not finished with key 6's last partition: finished %v", finishedTS(landed))
	}
	if want := append(pattern(64, 0), pattern(64, 3)...); !bytes.Equal(buf, want) {
		t.Errorf("Init's buffer %v, want %v", buf, want)
	}
}

// A sum that lands before this worker pushed its key (worker 0's init
// values, before this worker's Init) counts in the report to the LB once
// the key is pushed: counted at once, it would make the init round look
// complete while key 6's sum is still to come, and Done would pass it.
func TestCoreSumBeforePushNotReported(t *testing.T) {
	c := retryCore(t, 1) // key 5 declared
	mustDeclare(t, c, 6, 64)
	keyed := func(key uint64) []frame.Header {
		hs := results(c, key, 0)
		for i := range hs {
			hs[i].Aux = c.schedule.At(0).Version
		}
		return hs
	}
	if early := deliver(t, c, keyed(5), pattern(64, 0)); early.began != nil {
		t.Fatalf("key 5's sum before this worker's Init reported iteration %d complete", early.began.iter)
	}
	pp, err := c.push([]uint64{5, 6}, make([]byte, 128), []int{64, 64}, frame.Float32, 0, &call{})
	if err != nil {
		t.Fatal(err)
	}
	if pp.began != nil {
		t.Fatalf("Init's push reported iteration %d complete without key 6's sum", pp.began.iter)
	}
	handOver(c, pp)
	if last := deliver(t, c, keyed(6), pattern(64, 3)); last.began == nil || last.began.iter != 1 {
		t.Errorf("key 6's sum reported %+v, want the init round complete (began 1)", last.began)
	}
}

// With one key, a sum that landed before the key's push (worker 0's init
// values reach this worker before its Init) completes the init round at
// the push: nothing else will land to report it, and the LB's Done would
// never pass the round.
func TestCoreSumBeforePushReportedAtPush(t *testing.T) {
	c := retryCore(t, 1) // key 5 declared
	hs := results(c, 5, 0)
	for i := range hs {
		hs[i].Aux = c.schedule.At(0).Version
	}
	if early := deliver(t, c, hs, pattern(64, 0)); early.began != nil {
		t.Fatalf("key 5's sum before this worker's Init reported iteration %d complete", early.began.iter)
	}
	pp, err := c.push([]uint64{5}, make([]byte, 64), []int{64}, frame.Float32, 0, &call{})
	if err != nil {
		t.Fatal(err)
	}
	if pp.began == nil || pp.began.iter != 1 {
		t.Errorf("Init's push after its only key's sum reported %+v, want the init round complete (began 1)", pp.began)
	}
}
