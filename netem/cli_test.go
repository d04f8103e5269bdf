package netem

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
)

func TestParseCLIArgs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		hosts   []HostSpec
		cluster bool
		words   []string
		wantErr string
	}{
		{name: "hosts list", args: []string{"--hosts", "1gbit,200mbit,none", "--", "sh", "-c", "true"},
			hosts: []HostSpec{{Up: "1gbit", Down: "1gbit"}, {Up: "200mbit", Down: "200mbit"}, {}}, words: []string{"sh", "-c", "true"}},
		{name: "repeated host, in order", args: []string{"--host", "1gbit", "--host", "100mbit/1gbit", "--", "true"},
			hosts: []HostSpec{{Up: "1gbit", Down: "1gbit"}, {Up: "100mbit", Down: "1gbit"}}, words: []string{"true"}},
		{name: "cluster without app flags", args: []string{"--hosts", "1gbit", "--cluster"},
			hosts: []HostSpec{{Up: "1gbit", Down: "1gbit"}}, cluster: true},
		{name: "cluster with app flags", args: []string{"--hosts", "1gbit,1gbit", "--cluster", "--", "--iters", "5"},
			hosts: []HostSpec{{Up: "1gbit", Down: "1gbit"}, {Up: "1gbit", Down: "1gbit"}}, cluster: true, words: []string{"--iters", "5"}},
		{name: "no hosts", args: []string{"--", "true"}, wantErr: "no hosts"},
		{name: "no command", args: []string{"--hosts", "1gbit"}, wantErr: "no command"},
		{name: "bad spec", args: []string{"--hosts", "1gbit,fast", "--", "true"}, wantErr: `host spec "fast"`},
		{name: "empty spec", args: []string{"--hosts", "1gbit,,1gbit", "--", "true"}, wantErr: "empty rate"},
		{name: "bad port", args: []string{"--hosts", "1gbit", "--cluster", "--port", "65535"}, wantErr: "port 65535"},
	} {
		o, err := parseCLIArgs(tc.args, io.Discard)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(o.hosts, tc.hosts) || o.cluster != tc.cluster || !slices.Equal(o.words, tc.words) {
			t.Errorf("%s: %+v, %v; want hosts %v cluster %v words %q", tc.name, o, err, tc.hosts, tc.cluster, tc.words)
		}
	}
	if _, err := parseCLIArgs([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

func TestClusterArgs(t *testing.T) {
	for _, tc := range []struct {
		i    int
		app  []string
		want string
	}{
		{0, nil, "--scheduler -s 1 -w 1 --first-server 0 --first-worker 0 --root 198.18.0.1:9000 --num-servers 3 --num-workers 3 --iface eth0"},
		{2, []string{"--iters", "5"}, "-s 1 -w 1 --first-server 2 --first-worker 2 --root 198.18.0.1:9000 --num-servers 3 --num-workers 3 --iface eth0 -- --iters 5"},
	} {
		if got := strings.Join(clusterArgs(tc.i, 3, "198.18.0.1:9000", "eth0", tc.app), " "); got != tc.want {
			t.Errorf("clusterArgs(%d, %q) = %q, want %q", tc.i, tc.app, got, tc.want)
		}
	}
}

func TestHostEnv(t *testing.T) {
	got := hostEnv(1, 3, "198.18.0.2", "198.18.0.1", "eth0")
	want := []string{"FPT_NETEM_HOST=1", "FPT_NETEM_HOSTS=3", "FPT_NETEM_ADDR=198.18.0.2", "FPT_NETEM_ROOT=198.18.0.1", "FPT_NETEM_IFACE=eth0"}
	if !slices.Equal(got, want) {
		t.Errorf("hostEnv = %q, want %q", got, want)
	}
}

func TestLinePrefixer(t *testing.T) {
	long := strings.Repeat("x", maxLine+10)
	for _, tc := range []struct {
		name   string
		writes []string
		want   string
	}{
		{"whole lines", []string{"a\nb\n"}, "[h1] a\n[h1] b\n"},
		{"split lines", []string{"ab", "c\nd", "e\n"}, "[h1] abc\n[h1] de\n"},
		{"last line without newline", []string{"a\nb"}, "[h1] a\n[h1] b\n"},
		{"empty lines", []string{"\n\n"}, "[h1] \n[h1] \n"},
		{"nothing", nil, ""},
		{"overlong line is cut", []string{long}, "[h1] " + long[:maxLine] + "\n[h1] " + long[maxLine:] + "\n"},
	} {
		var out bytes.Buffer
		p := &linePrefixer{mu: &sync.Mutex{}, w: &out, prefix: "[h1] "}
		for _, w := range tc.writes {
			if n, err := p.Write([]byte(w)); n != len(w) || err != nil {
				t.Errorf("%s: Write = %d, %v", tc.name, n, err)
			}
		}
		if err := p.Flush(); err != nil {
			t.Errorf("%s: Flush: %v", tc.name, err)
		}
		if got := out.String(); got != tc.want {
			t.Errorf("%s: wrote %q, want %q", tc.name, shorten(got), shorten(tc.want))
		}
	}
}

func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"kill -TERM $$", 143},
		{"kill -KILL $$", 137},
	} {
		err := exec.Command("sh", "-c", tc.script).Run()
		if got := exitStatus(err); got != tc.want {
			t.Errorf("%s: status %d (%v), want %d", tc.script, got, err, tc.want)
		}
	}
	if got := exitStatus(errors.New("exec: not found")); got != 1 {
		t.Errorf("a command that did not start: status %d, want 1", got)
	}
}

// shorten keeps a failure's message readable.
func shorten(s string) string {
	if len(s) > 100 {
		return fmt.Sprintf("%s...(%d bytes)...%s", s[:40], len(s), s[len(s)-40:])
	}
	return s
}
