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
//	header  magic "FPTKVST\n", version uint32, entry count uint64
//	entry   key uint64, dtype uint8, length uint64, length bytes of value
//	trailer CRC-32C (Castagnoli) of everything before it, uint32
//
// Entries are in strictly increasing key order. A reader checks the
// checksum before it believes any length, so a torn or corrupted file is
// refused as a whole rather than half-loaded.
const (
	magic       = "FPTKVST\n"
	version     = 1
	headerSize  = len(magic) + 4 + 8
	entryHead   = 8 + 1 + 8
	trailerSize = 4
)

// ErrCorrupt is wrapped by every error Load returns for bad input.
var ErrCorrupt = errors.New("kvstore: not a valid snapshot")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Snapshot writes the whole store to w in key order. It returns the bytes
// written.
func (s *Store) Snapshot(w io.Writer) (int64, error) {
	sum := crc32.New(castagnoli)
	bw := bufio.NewWriterSize(io.MultiWriter(w, sum), 64<<10)
	var head [headerSize]byte
	copy(head[:], magic)
	binary.LittleEndian.PutUint32(head[len(magic):], version)
	binary.LittleEndian.PutUint64(head[len(magic)+4:], uint64(s.tree.Len()))
	n, _ := bw.Write(head[:]) // bufio keeps the first error; Flush reports it
	written := int64(n)
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

// Load reads a store from a whole snapshot. It refuses, wrapping
// ErrCorrupt, anything that is not exactly one intact snapshot: a short or
// torn file, a wrong checksum, magic or version, a length past the end, a
// value that is not whole elements of a known dtype, keys out of order, or
// bytes after the last entry. Values share b's memory (no second copy of a
// large store), so b must not be reused.
func Load(b []byte) (*Store, error) {
	if len(b) < headerSize+trailerSize {
		return nil, fmt.Errorf("%w: %d bytes, shorter than a header and checksum (%d)", ErrCorrupt, len(b), headerSize+trailerSize)
	}
	if string(b[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: wrong magic %q", ErrCorrupt, b[:len(magic)])
	}
	if v := binary.LittleEndian.Uint32(b[len(magic):]); v != version {
		return nil, fmt.Errorf("%w: version %d, this build reads version %d", ErrCorrupt, v, version)
	}
	body, tail := b[:len(b)-trailerSize], b[len(b)-trailerSize:]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(tail); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, the file says %08x (torn or corrupted)", ErrCorrupt, got, want)
	}
	count := binary.LittleEndian.Uint64(b[len(magic)+4:])
	rest := body[headerSize:]
	// Every entry takes at least its head: a count the body cannot hold is
	// refused before anything is allocated for it.
	if count > uint64(len(rest))/entryHead {
		return nil, fmt.Errorf("%w: %d entries cannot fit in %d bytes", ErrCorrupt, count, len(rest))
	}
	s := New()
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
		s.tree.ReplaceOrInsert(entry{key: key, Value: Value{DType: dtype, Data: data}})
		prev = key
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last of %d entries", ErrCorrupt, len(rest), count)
	}
	return s, nil
}
