package frame

import (
	"errors"
	"testing"
)

// FuzzHeaderFields builds a header from arbitrary field values and encodes
// it with a correct checksum, so that the fuzzer explores Validate rather
// than the CRC (which FuzzDecode's raw bytes almost never get past).
// Decoding must either refuse with one of the package's errors or give back
// exactly the fields that were encoded, and it must not allocate: a header
// is parsed before anything is known about its sender.
func FuzzHeaderFields(f *testing.F) {
	v := validHeader()
	f.Add(uint8(v.Type), uint8(v.DType), v.Flags, v.Sender, v.Recipient, v.Key, v.Iteration, v.Offset, v.Total, v.Length, v.Partition, v.Priority, v.Aux)
	f.Add(uint8(Hello), uint8(0), uint8(0), uint32(9), uint32(8), uint64(0), uint64(0), uint64(0), uint64(0), uint64(0), uint32(0), int32(0), uint32(0))
	f.Add(uint8(Push), uint8(Float32), uint8(0), uint32(9), uint32(8), uint64(0), uint64(0), uint64(0), uint64(1)<<62, uint64(4096), uint32(0), int32(0), uint32(0))
	f.Add(uint8(Push), uint8(Float32), uint8(0), uint32(1001), uint32(8), uint64(0), uint64(0), uint64(0), uint64(0), uint64(1)<<30, uint32(0), int32(0), uint32(0))
	const maxPayload = 1 << 20
	f.Fuzz(func(t *testing.T, typ, dtype, flags uint8, sender, recipient uint32, key, iter, off, total, length uint64, part uint32, prio int32, aux uint32) {
		h := Header{Type: Type(typ), DType: DType(dtype), Flags: flags, Sender: sender, Recipient: recipient,
			Key: key, Iteration: iter, Offset: off, Total: total, Length: length, Partition: part, Priority: prio, Aux: aux}
		buf := make([]byte, HeaderSize)
		h.Encode(buf)
		var got Header
		var err error
		allocs := testing.AllocsPerRun(1, func() { got, err = Decode(buf, maxPayload) })
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("refused with an unexpected error: %v", err)
			}
			if length > maxPayload && !errors.Is(err, ErrTooLarge) && h.Validate(1<<63) == nil {
				t.Fatalf("length %d > %d refused for another reason: %v", length, maxPayload, err)
			}
			return
		}
		if allocs > 0 {
			t.Fatalf("Decode of a valid header allocated %v times", allocs)
		}
		if got != h {
			t.Fatalf("decoded %+v, encoded %+v", got, h)
		}
		if got.Length > maxPayload {
			t.Fatalf("accepted a %d-byte payload over the %d bound", got.Length, maxPayload)
		}
		_ = got.String()
	})
}
