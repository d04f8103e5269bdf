package frame_test

import (
	"fmt"

	"github.com/fptps/fpt/frame"
)

// A header travels as 72 bytes; Decode validates it before anyone trusts
// its lengths.
func ExampleDecode() {
	h := frame.Header{
		Type: frame.Push, DType: frame.Float32, Sender: 9, Recipient: 8,
		Key: 42, Iteration: 3, Offset: 1 << 20, Total: 3 << 30, Length: 1 << 20, Partition: 1,
	}
	var buf [frame.HeaderSize]byte
	h.Encode(buf[:])

	got, err := frame.Decode(buf[:], 1<<30)
	fmt.Println(got.Type, got.Key, got.Total, err)

	buf[20] ^= 1 // a flipped bit
	_, err = frame.Decode(buf[:], 1<<30)
	fmt.Println(err != nil)
	// Output:
	// push 42 3221225472 <nil>
	// true
}
