package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/kvstore"
	"github.com/fptps/fpt/node"
)

// writeCkpt writes server w's checkpoint of label under layout l,
// holding keys (each a float32 of value key).
func writeCkpt(t *testing.T, dir string, label ckptLabel, l classic.Layout, w node.ID, keys ...uint64) string {
	t.Helper()
	s := kvstore.New()
	for _, k := range keys {
		v := binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(k)))
		if _, err := s.Add(k, frame.Float32, 0, v, 4); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	if _, err := s.Snapshot(&b, ckptMeta(label, w, l)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, ckptName(label, w))
	if err := writeAtomic(path, b.Bytes()); err != nil { // as servers write them
		t.Error(err)
	}
	return path
}

// keysOf is a store's keys; each value must be its key (writeCkpt's).
func keysOf(t *testing.T, s *kvstore.Store) []uint64 {
	t.Helper()
	var keys []uint64
	s.Ascend(0, 0, func(k uint64, v kvstore.Value) bool {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(v.Data)); got != float32(k) {
			t.Fatalf("key %d holds %v", k, got)
		}
		keys = append(keys, k)
		return true
	})
	return keys
}

func TestCkptNames(t *testing.T) {
	f := ckptFile{ckptLabel: ckptLabel{stamp: 0x187a3b2c4d5e6f70, version: 3}, server: 12}
	name := ckptName(f.ckptLabel, f.server)
	if name != "job-187a3b2c4d5e6f70-layout-3-server-12.ckpt" {
		t.Fatalf("name %s", name)
	}
	if got, ok := parseCkptName(name); !ok || got.ckptLabel != f.ckptLabel || got.server != f.server || got.name != name {
		t.Fatalf("parsed %+v, %v", got, ok)
	}
	for _, bad := range []string{"server-0.ckpt", "job-187a3b2c4d5e6f70-layout-3-server-12.ckpt.tmp123",
		"job-187a3b2c4d5e6f7-layout-3-server-12.ckpt", "job-187a3b2c4d5e6f70-layout-03-server-12.ckpt",
		"job-187a3b2c4d5e6f70-layout-3-server-x.ckpt", "job-187a3b2c4d5e6f70-layout-3-worker-12.ckpt"} {
		if f, ok := parseCkptName(bad); ok {
			t.Errorf("%s parsed as %+v", bad, f)
		}
	}
	if !legacyCkpt("server-1.ckpt") || legacyCkpt(name) {
		t.Error("legacyCkpt")
	}
}

func TestCkptSets(t *testing.T) {
	a, b := ckptLabel{1, 0}, ckptLabel{1, 2}
	c := ckptLabel{2, 0} // a later run: newer than any layout of run 1
	files := []ckptFile{{a, 9, "a9"}, {c, 8, "c8"}, {b, 10, "b10"}, {a, 8, "a8"}, {b, 8, "b8"}}
	var got [][]string
	for _, set := range ckptSets(files) {
		var names []string
		for _, f := range set {
			names = append(names, f.name)
		}
		got = append(got, names)
	}
	want := [][]string{{"c8"}, {"b8", "b10"}, {"a8", "a9"}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("sets %v, want %v", got, want)
	}
	l := classic.Layout{Servers: []node.ID{8, 9}}
	if m := missing(ckptSets(files)[2], l); m != 0 {
		t.Fatalf("a complete set misses %s", m)
	}
	if m := missing(ckptSets(files)[1], l); m != 9 {
		t.Fatalf("missing %s, want server 9", m)
	}
}

func TestLoadCheckpoint(t *testing.T) {
	half := uint64(1) << 63
	// Keys all over the key space: each third of it, each half.
	keys := []uint64{1, 1 << 62, half - 2, half, half + 1<<61, 1<<64 - 2}
	two := classic.Layout{Version: 4, Servers: []node.ID{8, 14}} // a job that grew, then lost server 10
	three := classic.Initial([]node.ID{8, 10, 12})
	run1, run2 := ckptLabel{stamp: 100, version: 4}, ckptLabel{stamp: 200, version: 1}
	both := func(t *testing.T, dir string) {
		writeCkpt(t, dir, run1, two, 8, keys[:3]...)
		writeCkpt(t, dir, run1, two, 14, keys[3:]...)
	}
	bothTorn := func(t *testing.T, dir string) { // 14's file loses its last byte
		both(t, dir)
		p := filepath.Join(dir, ckptName(run1, 14))
		b, _ := os.ReadFile(p)
		_ = os.WriteFile(p, b[:len(b)-1], 0o600)
	}
	tests := []struct {
		name  string
		files func(t *testing.T, dir string)
		self  node.ID
		want  []uint64
		err   string
	}{
		{"no checkpoint: the first start", func(*testing.T, string) {}, 8, nil, ""},
		{"first of three, from a set of two", both, 8, keys[:2], ""},
		{"middle of three", both, 10, keys[2:5], ""},
		{"last of three", both, 12, keys[5:], ""},
		{"a newer set that is incomplete is passed over", func(t *testing.T, dir string) {
			both(t, dir)
			writeCkpt(t, dir, ckptLabel{stamp: 100, version: 5}, classic.Layout{Version: 5, Servers: []node.ID{8, 14, 16}}, 8)
		}, 12, keys[5:], ""},
		{"no complete set", func(t *testing.T, dir string) {
			writeCkpt(t, dir, run1, two, 8, keys[:3]...)
		}, 8, nil, "no complete set"},
		{"a torn file of the set", bothTorn, 12, nil, "checksum"},
		{"a torn file the server does not read is not read", bothTorn, 8, keys[:2], ""},
		{"a file renamed", func(t *testing.T, dir string) {
			both(t, dir)
			_ = os.Rename(filepath.Join(dir, ckptName(run1, 8)), filepath.Join(dir, ckptName(run1, 14)))
			writeCkpt(t, dir, run1, two, 8)
		}, 12, nil, "not what its name says"},
		{"this run's files are passed over: the others loaded already", func(t *testing.T, dir string) {
			both(t, dir)
			writeCkpt(t, dir, ckptLabel{stamp: 150}, three, 8, keys[:2]...)
			writeCkpt(t, dir, ckptLabel{stamp: 150}, three, 10, keys[2:5]...)
		}, 12, keys[5:], ""},
		{"the first start, others loaded already", func(t *testing.T, dir string) {
			writeCkpt(t, dir, ckptLabel{stamp: 150}, three, 8)
		}, 12, nil, ""},
		{"a set of a later run", func(t *testing.T, dir string) {
			writeCkpt(t, dir, ckptLabel{stamp: 150}, three, 8)
			writeCkpt(t, dir, run2, classic.Layout{Version: 1, Servers: []node.ID{8}}, 8, keys...)
		}, 8, nil, "clock"},
		{"an earlier fpt's file", func(t *testing.T, dir string) {
			_ = os.WriteFile(filepath.Join(dir, "server-0.ckpt"), nil, 0o600)
		}, 8, nil, "earlier fpt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.files(t, dir)
			s, _, err := loadCheckpoint(context.Background(), dir, tt.self, three, 150)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), dir) {
					t.Fatalf("error %v, want one naming %s and containing %q", err, dir, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := keysOf(t, s); !slices.Equal(got, tt.want) {
				t.Fatalf("loaded keys %v, want %v", got, tt.want)
			}
		})
	}
}

// TestLoadCheckpointCancelled: a load stops between files once its ctx
// ends (the start's timeout, or the job failing meanwhile).
func TestLoadCheckpointCancelled(t *testing.T) {
	dir := t.TempDir()
	l := classic.Initial([]node.ID{8})
	writeCkpt(t, dir, ckptLabel{stamp: 1}, l, 8, 1, 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := loadCheckpoint(ctx, dir, 8, l, 2); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("load under an ended ctx: %v, want context.Canceled naming %s", err, dir)
	}
}

// TestRemoveOlder: files older than the newest complete set go once it
// is complete; an incomplete newer set removes nothing.
func TestRemoveOlder(t *testing.T) {
	dir := t.TempDir()
	one := classic.Layout{Servers: []node.ID{8}}
	old := writeCkpt(t, dir, ckptLabel{1, 0}, one, 8, 5)
	// Temporary files a crash left: one of the old set, one of the new.
	oldTmp, newTmp := old+".tmp123", filepath.Join(dir, ckptName(ckptLabel{1, 1}, 10)+".tmp456")
	for _, f := range []string{oldTmp, newTmp} {
		if err := os.WriteFile(f, []byte("half a checkp"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	grown := classic.Layout{Version: 1, Servers: []node.ID{8, 10}}
	writeCkpt(t, dir, ckptLabel{1, 1}, grown, 8, 5)
	if err := removeOlder(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("the only complete set was removed: %v", err)
	}
	writeCkpt(t, dir, ckptLabel{1, 1}, grown, 10, 1<<63)
	if err := removeOlder(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("an older set is still there once a newer one is complete: %v", err)
	}
	if _, err := os.Stat(oldTmp); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the older set's temporary file is still there: %v", err)
	}
	if _, err := os.Stat(newTmp); err != nil {
		t.Fatalf("the newest set's temporary file (maybe being written) was removed: %v", err)
	}
	if s, err := ReadCheckpoint(dir); err != nil || !slices.Equal(keysOf(t, s), []uint64{5, 1 << 63}) {
		t.Fatalf("ReadCheckpoint: %v", err)
	}
}

func TestCheckDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		dir string
		ok  bool
	}{{dir, true}, {file, false}, {filepath.Join(dir, "missing"), false}} {
		if err := checkDir(tt.dir); (err == nil) != tt.ok || (err != nil && !strings.Contains(err.Error(), "FPT_CHECKPOINT_DIR "+tt.dir)) {
			t.Errorf("checkDir(%s) = %v, want ok %v", tt.dir, err, tt.ok)
		}
	}
}

func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.ckpt")
	for _, data := range [][]byte{[]byte("first, longer"), []byte("second")} {
		if err := writeAtomic(path, data); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("file holds %q (%v), want %q", got, err, data)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("%d files in the directory, want only the checkpoint", len(entries))
	}
	if err := writeAtomic(filepath.Join(dir, "missing", "x.ckpt"), nil); err == nil {
		t.Fatal("wrote into a missing directory")
	}
}

// idleCheckpointer is a checkpointer without its loop (stop works).
func idleCheckpointer(dir string, snap func(bool) (string, []byte, error)) *checkpointer {
	c := &checkpointer{dir: dir, snapshot: snap, log: slog.New(slog.NewTextHandler(io.Discard, nil)), quit: make(chan struct{}), done: make(chan struct{})}
	close(c.done)
	return c
}

// TestCheckpointerStop: the last write happens only if asked, and only if
// something changed or the write before failed.
func TestCheckpointerStop(t *testing.T) {
	tests := []struct {
		name    string
		changed bool
		failed  bool
		last    bool
		forced  bool // the snapshot was asked to write anyway
		written bool
	}{
		{"clean end, changed", true, false, true, false, true},
		{"clean end, unchanged", false, false, true, false, false},
		{"clean end after a failed write", false, true, true, true, true},
		{"failed end", true, false, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var forced bool
			snap := func(force bool) (string, []byte, error) {
				forced = force
				if tt.changed || force {
					return "x.ckpt", []byte("data"), nil
				}
				return "", nil, nil
			}
			c := idleCheckpointer(dir, snap)
			c.failed = tt.failed
			if err := c.stop(tt.last); err != nil {
				t.Fatal(err)
			}
			_, err := os.Stat(filepath.Join(dir, "x.ckpt"))
			if written := err == nil; written != tt.written || forced != tt.forced {
				t.Fatalf("written %v (forced %v), want %v (forced %v)", written, forced, tt.written, tt.forced)
			}
		})
	}
}

// TestCheckpointerWritesAtStart: the first write does not wait for the
// first interval (a restarted job's set completes, and the last run's
// goes, as soon as its servers loaded).
func TestCheckpointerWritesAtStart(t *testing.T) {
	dir := t.TempDir()
	snap := func(bool) (string, []byte, error) { return "x.ckpt", []byte("data"), nil }
	c := startCheckpointer(dir, time.Hour, snap, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.halt()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "x.ckpt")); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no write within a minute of the start; the interval is an hour")
		}
	}
}

func TestCheckpointerRetriesAfterFailure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "later") // not there yet
	calls := 0
	snap := func(force bool) (string, []byte, error) {
		calls++
		if calls == 1 || force {
			return "x.ckpt", []byte("data"), nil
		}
		return "", nil, nil
	}
	c := idleCheckpointer(dir, snap)
	if err := c.write(); err == nil || !c.failed {
		t.Fatalf("write into a missing directory: %v, failed %v", err, c.failed)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := c.write(); err != nil || c.failed {
		t.Fatalf("retry: %v, failed %v", err, c.failed)
	}
	if _, err := os.Stat(filepath.Join(dir, "x.ckpt")); err != nil {
		t.Fatal("the retry, with nothing changed, did not write the store")
	}
	if err := c.write(); err != nil || calls != 3 {
		t.Fatalf("unchanged write: %v after %d snapshots", err, calls)
	}
}

// BenchmarkLoadCheckpoint is a restarted server's load: a set of three
// servers' files of 100,000 sparse keys each (32-byte values), read by
// the first of two servers, which keeps half the keys from two of the
// files. Bytes are those of the files it reads.
//
//	go test -run - -bench LoadCheckpoint -benchtime 20x ./server
func BenchmarkLoadCheckpoint(b *testing.B) {
	dir := b.TempDir()
	three := classic.Initial([]node.ID{8, 10, 12})
	label := ckptLabel{stamp: 1}
	const perServer = 100_000
	value := make([]byte, 32)
	var read int64
	for i, id := range three.Servers {
		s := kvstore.New()
		from, _, _ := three.Range(id)
		step := uint64(math.MaxUint64 / 3 / perServer)
		for k := range uint64(perServer) {
			if _, err := s.Add(from+k*step, frame.Float32, 0, value, uint64(len(value))); err != nil {
				b.Fatal(err)
			}
		}
		var buf bytes.Buffer
		if _, err := s.Snapshot(&buf, ckptMeta(label, id, three)); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ckptName(label, id)), buf.Bytes(), 0o600); err != nil {
			b.Fatal(err)
		}
		if i < 2 {
			read += int64(buf.Len())
		}
	}
	two := classic.Initial([]node.ID{8, 10})
	b.SetBytes(read)
	b.ResetTimer()
	for range b.N {
		s, _, err := loadCheckpoint(context.Background(), dir, 8, two, 2)
		if err != nil {
			b.Fatal(err)
		}
		if s.Len() < perServer*3/2-2 || s.Len() > perServer*3/2+2 {
			b.Fatalf("loaded %d keys, want about %d", s.Len(), perServer*3/2)
		}
	}
}

// TestRemoveOlderConcurrently: two servers write each layout's file and
// remove the older sets at the same moments; a set the other removed
// between the listing and the reading of its meta is not an error.
func TestRemoveOlderConcurrently(t *testing.T) {
	dir := t.TempDir()
	servers := []node.ID{8, 10}
	errs := make(chan error, len(servers))
	for _, id := range servers {
		go func() {
			for v := range uint32(300) {
				writeCkpt(t, dir, ckptLabel{1, v}, classic.Layout{Version: v, Servers: servers}, id)
				if err := removeOlder(dir); err != nil {
					errs <- fmt.Errorf("server %d, layout %d: %w", id, v, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range servers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 2 {
		t.Fatalf("files left: %v, want the last set's two", files)
	}
}
