package kvstore

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzLoad feeds arbitrary bytes to Load: it must refuse them with
// ErrCorrupt or load a store that snapshots back to exactly them (the
// format has one encoding per store).
func FuzzLoad(f *testing.F) {
	f.Add(snapshot(f, sample(f)))
	f.Add(snapshot(f, New()))
	f.Add(snapshotMeta(f, sample(f), []byte("label")))
	f.Add([]byte(magic))
	f.Fuzz(func(t *testing.T, b []byte) {
		in := append([]byte(nil), b...)
		s, meta, err := Load(in)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("refused without ErrCorrupt: %v", err)
			}
			return
		}
		if out := snapshotMeta(t, s, meta); !bytes.Equal(out, b) {
			t.Fatalf("loaded %d keys that snapshot to other bytes", s.Len())
		}
	})
}
