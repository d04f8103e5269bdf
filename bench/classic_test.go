package bench

import (
	"slices"
	"testing"
)

func TestParseProgramReport(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      programReport
		wantErr   bool
	}{
		{"among other lines", "worker 0: PASS: ...\nbench: {\"rank\":1,\"push_s\":0.5,\"pull_s\":0.25,\"moved_bytes\":1000}\n",
			programReport{Rank: 1, PushS: 0.5, PullS: 0.25, MovedBytes: 1000}, false},
		{"no report", "worker 0: PASS\n", programReport{}, true},
		{"bad JSON", "bench: {\"rank\":\n", programReport{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProgramReport(tc.out)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The FPT path moves the sparse case as one tensor; ps-lite's dense run
// needs the program's own handle (ps-lite's default keeps one value per key).
func TestClassicProgramArgs(t *testing.T) {
	cases := classicCases(4, 8<<20, 1000)
	if cases[0].bytes != 32<<20 || cases[1].bytes != 4000 {
		t.Fatalf("cases %+v", cases)
	}
	for _, tc := range []struct {
		c    classicCase
		path string
		want []string
	}{
		{cases[0], classicPathClassic, []string{"p", "-bytes", "33554432", "-keys", "4", "-iters", "3", "-mode", "classic", "-handle", "default"}},
		{cases[1], classicPathFPT, []string{"p", "-bytes", "4000", "-keys", "1", "-iters", "3", "-mode", "fpt", "-handle", "default"}},
		{cases[0], classicPathPSLite, []string{"p", "-bytes", "33554432", "-keys", "4", "-iters", "3", "-mode", "classic", "-handle", "vector"}},
		{cases[1], classicPathPSLite, []string{"p", "-bytes", "4000", "-keys", "1000", "-iters", "3", "-mode", "classic", "-handle", "default"}},
	} {
		if got := tc.c.programArgs("p", tc.path, 3); !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: %q, want %q", tc.c.name, tc.path, got, tc.want)
		}
	}
}
