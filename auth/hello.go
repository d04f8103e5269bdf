package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// The data plane's authenticated Hello is a challenge–response over the
// connection the dialer opened:
//
//	dialer → acceptor: Hello frame header (Length = NonceSize), dialer nonce
//	acceptor → dialer: Challenge (acceptor nonce, acceptor MAC)
//	dialer → acceptor: dialer MAC
//
// Each MAC is HMAC-SHA256, keyed by the data-plane key (Derive with
// HelloPurpose), over the Transcript: both nonces, both ids, and a label
// saying which side speaks, so that one side's MAC can never be replayed as
// the other's. Fresh nonces on both sides make every MAC good for one
// connection only. The acceptor proves itself first; the dialer's MAC is
// the last thing read before frames, so that no frame of a peer without the
// key is ever read.

// HelloPurpose is the label the data-plane key is derived under.
const HelloPurpose = "fpt data hello v1"

// Sizes of the Hello's parts, in bytes.
const (
	KeySize       = 32
	NonceSize     = 32
	MACSize       = sha256.Size
	ChallengeSize = NonceSize + MACSize
)

// Side names who computes a MAC.
type Side uint8

// Sides of a connection.
const (
	Dialer Side = iota + 1
	Acceptor
)

func (s Side) label() string {
	switch s {
	case Dialer:
		return "fpt data hello v1 dialer"
	case Acceptor:
		return "fpt data hello v1 acceptor"
	}
	return "fpt data hello v1 invalid side"
}

// Transcript is what both MACs of one connection cover.
type Transcript struct {
	DialerID, AcceptorID       uint32
	DialerNonce, AcceptorNonce [NonceSize]byte
}

// MAC is side's proof over t under key.
func (t *Transcript) MAC(key []byte, side Side) [MACSize]byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(side.label()))
	var ids [8]byte
	binary.BigEndian.PutUint32(ids[0:], t.DialerID)
	binary.BigEndian.PutUint32(ids[4:], t.AcceptorID)
	m.Write(ids[:])
	m.Write(t.DialerNonce[:])
	m.Write(t.AcceptorNonce[:])
	var out [MACSize]byte
	m.Sum(out[:0])
	return out
}

// ErrBadMAC is returned when a peer's MAC does not verify: it does not have
// the job's secret (or the transcript was tampered with).
var ErrBadMAC = errors.New("auth: hello MAC does not verify (wrong or missing cluster secret?)")

// Verify checks side's mac over t in constant time.
func (t *Transcript) Verify(key []byte, side Side, mac []byte) error {
	want := t.MAC(key, side)
	if !hmac.Equal(want[:], mac) {
		return ErrBadMAC
	}
	return nil
}

// EncodeChallenge lays out the acceptor's answer to a Hello.
func EncodeChallenge(nonce [NonceSize]byte, mac [MACSize]byte) [ChallengeSize]byte {
	var b [ChallengeSize]byte
	copy(b[:NonceSize], nonce[:])
	copy(b[NonceSize:], mac[:])
	return b
}

// DecodeChallenge splits the acceptor's answer; b must be exactly
// ChallengeSize bytes.
func DecodeChallenge(b []byte) (nonce [NonceSize]byte, mac [MACSize]byte, err error) {
	if len(b) != ChallengeSize {
		return nonce, mac, fmt.Errorf("auth: hello challenge of %d bytes, want %d", len(b), ChallengeSize)
	}
	copy(nonce[:], b[:NonceSize])
	copy(mac[:], b[NonceSize:])
	return nonce, mac, nil
}

// HelloKey derives the data-plane key from the job's secret.
func HelloKey(secret string) ([]byte, error) { return Derive(secret, HelloPurpose, KeySize) }
