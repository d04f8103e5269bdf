package server

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/kvstore"
)

func snapshotOf(t *testing.T, keys ...uint64) []byte {
	t.Helper()
	s := kvstore.New()
	for _, k := range keys {
		if _, err := s.Add(k, frame.Float32, 0, []byte{0, 0, 0x80, 0x3f}, 4); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	if _, err := s.Snapshot(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestLoadCheckpoint(t *testing.T) {
	dir := t.TempDir()
	good := snapshotOf(t, 1, 2, 3)
	tests := []struct {
		name    string
		content []byte // nil: no file
		keys    int
		err     string
	}{
		{"no file: first start", nil, 0, ""},
		{"a checkpoint", good, 3, ""},
		{"torn", good[:len(good)-1], 0, "checksum"},
		{"not a checkpoint", []byte("hello, world, this is not a store"), 0, "wrong magic"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := checkpointPath(dir, i)
			if tt.content != nil {
				if err := os.WriteFile(path, tt.content, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			s, err := loadCheckpoint(path)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), path) {
					t.Fatalf("error %v, want one naming %s and containing %q", err, path, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Len() != tt.keys {
				t.Fatalf("loaded %d keys, want %d", s.Len(), tt.keys)
			}
		})
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
	path := checkpointPath(dir, 0)
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

// TestCheckpointerStop: the last write happens only if asked, and only if
// something changed or the write before failed.
func TestCheckpointerStop(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
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
			path := checkpointPath(t.TempDir(), 0)
			var forced bool
			snap := func(force bool) ([]byte, bool, error) {
				forced = force
				if tt.changed || force {
					return []byte("data"), true, nil
				}
				return nil, false, nil
			}
			c := startCheckpointer(path, time.Hour, snap, log)
			c.failed = tt.failed // before the loop's first tick, an hour away
			if err := c.stop(tt.last); err != nil {
				t.Fatal(err)
			}
			_, err := os.Stat(path)
			if written := err == nil; written != tt.written || forced != tt.forced {
				t.Fatalf("written %v (forced %v), want %v (forced %v)", written, forced, tt.written, tt.forced)
			}
		})
	}
}

func TestCheckpointerRetriesAfterFailure(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	path := checkpointPath(filepath.Join(dir, "later"), 0) // its directory is not there yet
	calls := 0
	snap := func(force bool) ([]byte, bool, error) {
		calls++
		if calls == 1 || force {
			return []byte("data"), true, nil
		}
		return nil, false, nil
	}
	c := &checkpointer{path: path, snapshot: snap, log: log}
	if err := c.write(); err == nil || !c.failed {
		t.Fatalf("write into a missing directory: %v, failed %v", err, c.failed)
	}
	if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := c.write(); err != nil || c.failed {
		t.Fatalf("retry: %v, failed %v", err, c.failed)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal("the retry, with nothing changed, did not write the store")
	}
	if err := c.write(); err != nil || calls != 3 {
		t.Fatalf("unchanged write: %v after %d snapshots", err, calls)
	}
}
