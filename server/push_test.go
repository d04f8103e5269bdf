package server

import (
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/fptps/fpt/frame"
)

// recordingAgg is an aggregator that notes each push in a shared log.
type recordingAgg struct {
	log *[]string
	err error
}

func (a recordingAgg) HandlePush(h *frame.Header, payload []byte, inPlace bool) error {
	*a.log = append(*a.log, "push")
	return a.err
}

// TestHandlePushReportsAfterThePush checks that the LB's report for an
// iteration is made only once the aggregator has taken the push, so a
// step never waits for a report to be built and sent.
func TestHandlePushReportsAfterThePush(t *testing.T) {
	failed := errors.New("bad push")
	for _, tc := range []struct {
		name   string
		err    error
		report bool
		want   []string
	}{
		{"with the LB", nil, true, []string{"push", "report 7"}},
		{"push failed", failed, true, []string{"push", "report 7"}},
		{"without the LB", nil, false, []string{"push"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log []string
			var report func(uint64)
			if tc.report {
				report = func(iter uint64) {
					log = append(log, "report "+strconv.FormatUint(iter, 10))
				}
			}
			err := handlePush(recordingAgg{log: &log, err: tc.err}, report, &frame.Header{Type: frame.Push, Iteration: 7}, nil, false)
			if !errors.Is(err, tc.err) {
				t.Errorf("err = %v, want %v", err, tc.err)
			}
			if !slices.Equal(log, tc.want) {
				t.Errorf("calls = %q, want %q", log, tc.want)
			}
		})
	}
}
