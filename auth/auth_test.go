package auth

import (
	"bytes"
	"testing"
)

func TestDerive(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef"
	a, err := Derive(secret, "one", 32)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Derive(secret, "one", 32)
	other, _ := Derive(secret, "two", 32)
	otherSecret, _ := Derive(secret+"x", "one", 32)
	switch {
	case len(a) != 32:
		t.Errorf("%d bytes, want 32", len(a))
	case !bytes.Equal(a, again):
		t.Error("the same secret and purpose gave different keys")
	case bytes.Equal(a, other):
		t.Error("two purposes gave the same key")
	case bytes.Equal(a, otherSecret):
		t.Error("two secrets gave the same key")
	case bytes.Contains(a, []byte(secret[:8])):
		t.Error("the key contains the secret")
	}
	if _, err := Derive("", "one", 32); err == nil {
		t.Error("an empty secret derived a key")
	}
}
