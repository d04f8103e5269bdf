package auth

import (
	"crypto/ecdh"
	"fmt"
)

// Purpose labels of the control plane's CURVE keys. Every member derives
// the same two keypairs: the server's, which each node's ROUTER holds, and
// the client's, which each DEALER presents and the ZAP handler admits.
const (
	curveServerPurpose = "fpt control curve server v1"
	curveClientPurpose = "fpt control curve client v1"
)

// CurveKeypair is an X25519 keypair in ZeroMQ's CURVE form (Z85 text, 40
// characters per key), as ZMQ_CURVE_*KEY accept it.
type CurveKeypair struct {
	Public, Secret string
	// PublicRaw is the 32-byte public key, as a ZAP request carries it.
	PublicRaw []byte
}

// CurveKeys are the control plane's keys for one job.
type CurveKeys struct {
	Server, Client CurveKeypair
}

// DeriveCurve derives the control plane's CURVE keys from secret.
func DeriveCurve(secret string) (CurveKeys, error) {
	s, err := curveKeypair(secret, curveServerPurpose)
	if err != nil {
		return CurveKeys{}, err
	}
	c, err := curveKeypair(secret, curveClientPurpose)
	if err != nil {
		return CurveKeys{}, err
	}
	return CurveKeys{Server: s, Client: c}, nil
}

func curveKeypair(secret, purpose string) (CurveKeypair, error) {
	seed, err := Derive(secret, purpose, 32)
	if err != nil {
		return CurveKeypair{}, err
	}
	// libsodium clamps the scalar as crypto/ecdh does, so both compute the
	// same public key from these 32 bytes.
	priv, err := ecdh.X25519().NewPrivateKey(seed)
	if err != nil {
		return CurveKeypair{}, fmt.Errorf("auth: curve key %q: %w", purpose, err)
	}
	pub := priv.PublicKey().Bytes()
	return CurveKeypair{Public: Z85Encode(pub), Secret: Z85Encode(seed), PublicRaw: pub}, nil
}

const z85Alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"

// Z85Encode encodes b (a multiple of 4 bytes long) in ZeroMQ's Z85 (RFC 32).
// It panics on other lengths: the callers encode 32-byte keys.
func Z85Encode(b []byte) string {
	if len(b)%4 != 0 {
		panic(fmt.Sprintf("auth: Z85 of %d bytes, not a multiple of 4", len(b)))
	}
	out := make([]byte, 0, len(b)/4*5)
	for i := 0; i < len(b); i += 4 {
		v := uint32(b[i])<<24 | uint32(b[i+1])<<16 | uint32(b[i+2])<<8 | uint32(b[i+3])
		var chunk [5]byte
		for j := 4; j >= 0; j-- {
			chunk[j] = z85Alphabet[v%85]
			v /= 85
		}
		out = append(out, chunk[:]...)
	}
	return string(out)
}
