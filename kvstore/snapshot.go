package kvstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/fptps/fpt/frame"
)

// The snapshot format, little-endian:
//
//	header  magic "FPTKVST\n", version uint32, entry count uint64,
//	        meta length uint32, meta length bytes of meta
//	entry   key uint64, dtype uint8, length uint64, length bytes of value
//	trailer CRC-32C (Castagnoli) of everything before it, uint32
//
// Entries are in strictly increasing key order. Meta is the writer's: what
// the snapshot is of (package server's checkpoint label), opaque here. A
// reader checks the checksum before it believes any length, so a torn or
// corrupted file is refused as a whole rather than half-loaded.
const (
	magic       = "FPTKVST\n"
	version     = 2
	headerSize  = len(magic) + 4 + 8 + 4 // without the meta
	entryHead   = 8 + 1 + 8
	trailerSize = 4
	// MaxMeta bounds a snapshot's meta, so that ReadMeta allocates little
	// for a file that is not one.
	MaxMeta = 1 << 20
)

// ErrCorrupt is wrapped by every error Load returns for bad input.
var ErrCorrupt = errors.New("kvstore: not a valid snapshot")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Snapshot writes the whole store to w in key order, with meta (at most
// MaxMeta bytes) in its header. It returns the bytes written.
func (s *Store) Snapshot(w io.Writer, meta []byte) (int64, error) {
	if len(meta) > MaxMeta {
		return 0, fmt.Errorf("kvstore: snapshot: %d bytes of meta, at most %d", len(meta), MaxMeta)
	}
	sum := crc32.New(castagnoli)
	bw := bufio.NewWriterSize(io.MultiWriter(w, sum), 64<<10)
	var head [headerSize]byte
	copy(head[:], magic)
	binary.LittleEndian.PutUint32(head[len(magic):], version)
	binary.LittleEndian.PutUint64(head[len(magic)+4:], uint64(s.tree.Len()))
	binary.LittleEndian.PutUint32(head[len(magic)+12:], uint32(len(meta)))
	n, _ := bw.Write(head[:]) // bufio keeps the first error; Flush reports it
	m, _ := bw.Write(meta)
	written := int64(n + m)
	s.tree.Ascend(func(e entry) bool {
		var eh [entryHead]byte
		binary.LittleEndian.PutUint64(eh[0:], e.key)
		eh[8] = byte(e.DType)
		binary.LittleEndian.PutUint64(eh[9:], uint64(len(e.Data)))
		n1, _ := bw.Write(eh[:])
		n2, err := bw.Write(e.Data)
		written += int64(n1 + n2)
		return err == nil
	})
	if err := bw.Flush(); err != nil {
		return written, fmt.Errorf("kvstore: snapshot: %w", err)
	}
	var tail [trailerSize]byte
	binary.LittleEndian.PutUint32(tail[:], sum.Sum32())
	n, err := w.Write(tail[:])
	written += int64(n)
	if err != nil {
		return written, fmt.Errorf("kvstore: snapshot: %w", err)
	}
	return written, nil
}

// ReadMeta reads the meta at the head of a snapshot from r, and nothing
// after it. Only Load checks the checksum: a reader that chooses files by
// their meta loads them before it believes it.
func ReadMeta(r io.Reader) ([]byte, error) {
	var head [headerSize]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, fmt.Errorf("%w: header: %w", ErrCorrupt, err)
	}
	n, err := checkHeader(head[:])
	if err != nil {
		return nil, err
	}
	if n > MaxMeta {
		return nil, fmt.Errorf("%w: %d bytes of meta, at most %d", ErrCorrupt, n, MaxMeta)
	}
	meta := make([]byte, n)
	if _, err := io.ReadFull(r, meta); err != nil {
		return nil, fmt.Errorf("%w: meta: %w", ErrCorrupt, err)
	}
	return meta, nil
}

// checkHeader checks a header's magic and version, and returns its meta
// length.
func checkHeader(head []byte) (uint32, error) {
	if string(head[:len(magic)]) != magic {
		return 0, fmt.Errorf("%w: wrong magic %q", ErrCorrupt, head[:len(magic)])
	}
	if v := binary.LittleEndian.Uint32(head[len(magic):]); v != version {
		return 0, fmt.Errorf("%w: version %d, this build reads version %d", ErrCorrupt, v, version)
	}
	return binary.LittleEndian.Uint32(head[len(magic)+12:]), nil
}

// Load reads a store, and its meta, from a whole snapshot. It refuses,
// wrapping ErrCorrupt, anything that is not exactly one intact snapshot: a
// short or torn file, a wrong checksum, magic or version, a length past
// the end, a value that is not whole elements of a known dtype, keys out
// of order, or bytes after the last entry. Values and meta share b's
// memory (no second copy of a large store), so b must not be reused.
func Load(b []byte) (*Store, []byte, error) {
	s := New()
	meta, err := s.LoadRange(b, 0, 0, false)
	if err != nil {
		return nil, nil, err
	}
	return s, meta, nil
}

// LoadRange puts into s the keys of [from, to) (to == 0: no upper bound)
// of the snapshot b, replacing any s holds, and returns its meta. The
// whole snapshot is checked as Load checks it; on an error s may hold
// some of its keys, and should be dropped. Values share b's memory unless
// copied (copyValues: b may then go once s keeps only a part of it).
func (s *Store) LoadRange(b []byte, from, to uint64, copyValues bool) ([]byte, error) {
	if len(b) < headerSize+trailerSize {
		return nil, fmt.Errorf("%w: %d bytes, shorter than a header and checksum (%d)", ErrCorrupt, len(b), headerSize+trailerSize)
	}
	metaLen, err := checkHeader(b)
	if err != nil {
		return nil, err
	}
	body, tail := b[:len(b)-trailerSize], b[len(b)-trailerSize:]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(tail); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, the file says %08x (torn or corrupted)", ErrCorrupt, got, want)
	}
	if metaLen > MaxMeta {
		return nil, fmt.Errorf("%w: %d bytes of meta, at most %d", ErrCorrupt, metaLen, MaxMeta)
	}
	if uint64(metaLen) > uint64(len(body)-headerSize) {
		return nil, fmt.Errorf("%w: %d bytes of meta, only %d left", ErrCorrupt, metaLen, len(body)-headerSize)
	}
	meta := body[headerSize : headerSize+int(metaLen) : headerSize+int(metaLen)]
	count := binary.LittleEndian.Uint64(b[len(magic)+4:])
	rest := body[headerSize+int(metaLen):]
	// Every entry takes at least its head: a count the body cannot hold is
	// refused before anything is allocated for it.
	if count > uint64(len(rest))/entryHead {
		return nil, fmt.Errorf("%w: %d entries cannot fit in %d bytes", ErrCorrupt, count, len(rest))
	}
	var prev uint64
	for i := uint64(0); i < count; i++ {
		if len(rest) < entryHead {
			return nil, fmt.Errorf("%w: entry %d of %d: truncated head", ErrCorrupt, i, count)
		}
		key := binary.LittleEndian.Uint64(rest[0:])
		dtype := frame.DType(rest[8])
		length := binary.LittleEndian.Uint64(rest[9:])
		rest = rest[entryHead:]
		switch es := uint64(dtype.Size()); {
		case i > 0 && key <= prev:
			return nil, fmt.Errorf("%w: entry %d: key %d after key %d (keys must increase)", ErrCorrupt, i, key, prev)
		case es == 0:
			return nil, fmt.Errorf("%w: entry %d (key %d): unknown dtype %d", ErrCorrupt, i, key, uint8(dtype))
		case length > uint64(len(rest)):
			return nil, fmt.Errorf("%w: entry %d (key %d): %d bytes, only %d left", ErrCorrupt, i, key, length, len(rest))
		case length%es != 0:
			return nil, fmt.Errorf("%w: entry %d (key %d): %d bytes is not a whole number of %s", ErrCorrupt, i, key, length, dtype)
		}
		data := rest[:length:length]
		rest = rest[length:]
		if key >= from && (to == 0 || key < to) {
			if copyValues {
				data = append([]byte(nil), data...)
			}
			s.tree.ReplaceOrInsert(entry{key: key, Value: Value{DType: dtype, Data: data}})
		}
		prev = key
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last of %d entries", ErrCorrupt, len(rest), count)
	}
	return meta, nil
}
