package auth

import (
	"bytes"
	"crypto/ecdh"
	"testing"
)

func TestZ85Encode(t *testing.T) {
	// RFC 32's test vector.
	in := []byte{0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B}
	if got, want := Z85Encode(in), "HelloWorld"; got != want {
		t.Errorf("Z85Encode = %q, want %q", got, want)
	}
}

func TestDeriveCurve(t *testing.T) {
	a, err := DeriveCurve("0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := DeriveCurve("0123456789abcdef")
	other, _ := DeriveCurve("0123456789abcdeg")
	if a.Server.Public != b.Server.Public || a.Client.Secret != b.Client.Secret {
		t.Error("the same secret gave different keys")
	}
	if a.Server.Public == other.Server.Public || a.Client.Public == other.Client.Public {
		t.Error("different secrets gave the same keys")
	}
	if a.Server.Public == a.Client.Public {
		t.Error("the server and client keys are the same")
	}
	for _, k := range []CurveKeypair{a.Server, a.Client} {
		if len(k.Public) != 40 || len(k.Secret) != 40 || len(k.PublicRaw) != 32 {
			t.Errorf("key lengths %d, %d, %d; want 40, 40, 32", len(k.Public), len(k.Secret), len(k.PublicRaw))
		}
		if Z85Encode(k.PublicRaw) != k.Public {
			t.Error("PublicRaw and Public disagree")
		}
	}
	// The public key is the X25519 base-point product of the secret key.
	seed, _ := Derive("0123456789abcdef", curveClientPurpose, 32)
	priv, _ := ecdh.X25519().NewPrivateKey(seed)
	if !bytes.Equal(priv.PublicKey().Bytes(), a.Client.PublicRaw) {
		t.Error("client public key is not derived from its secret key")
	}
	if _, err := DeriveCurve(""); err == nil {
		t.Error("DeriveCurve(\"\") succeeded")
	}
}
