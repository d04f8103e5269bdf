package auth

import (
	"bytes"
	"errors"
	"testing"
)

func transcript() Transcript {
	t := Transcript{DialerID: 9, AcceptorID: 11}
	for i := range t.DialerNonce {
		t.DialerNonce[i] = byte(i)
		t.AcceptorNonce[i] = byte(100 + i)
	}
	return t
}

func TestHelloMAC(t *testing.T) {
	key, err := HelloKey("a secret of at least 16 bytes")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := HelloKey("another secret, sixteen+ bytes")
	base := transcript()
	good := base.MAC(key, Dialer)
	cases := []struct {
		name   string
		key    []byte
		side   Side
		change func(*Transcript)
		ok     bool
	}{
		{"same everything", key, Dialer, nil, true},
		{"wrong key", other, Dialer, nil, false},
		{"other side's label", key, Acceptor, nil, false},
		{"other dialer id", key, Dialer, func(t *Transcript) { t.DialerID = 10 }, false},
		{"ids swapped", key, Dialer, func(t *Transcript) { t.DialerID, t.AcceptorID = t.AcceptorID, t.DialerID }, false},
		{"other dialer nonce", key, Dialer, func(t *Transcript) { t.DialerNonce[0] ^= 1 }, false},
		{"other acceptor nonce", key, Dialer, func(t *Transcript) { t.AcceptorNonce[31] ^= 0x80 }, false},
		{"nonces swapped", key, Dialer, func(t *Transcript) { t.DialerNonce, t.AcceptorNonce = t.AcceptorNonce, t.DialerNonce }, false},
	}
	for _, c := range cases {
		tr := base
		if c.change != nil {
			c.change(&tr)
		}
		err := tr.Verify(c.key, c.side, good[:])
		if (err == nil) != c.ok {
			t.Errorf("%s: Verify = %v, want ok=%v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrBadMAC) {
			t.Errorf("%s: error %v is not ErrBadMAC", c.name, err)
		}
	}
	if err := base.Verify(key, Dialer, good[:MACSize-1]); err == nil {
		t.Error("a truncated MAC verified")
	}
	if a := base.MAC(key, Acceptor); bytes.Equal(a[:], good[:]) {
		t.Error("the two sides' MACs are equal")
	}
}

func TestChallengeRoundTrip(t *testing.T) {
	tr := transcript()
	mac := tr.MAC([]byte("k"), Acceptor)
	b := EncodeChallenge(tr.AcceptorNonce, mac)
	nonce, got, err := DecodeChallenge(b[:])
	if err != nil || nonce != tr.AcceptorNonce || got != mac {
		t.Fatalf("DecodeChallenge = %x %x %v", nonce, got, err)
	}
	for _, n := range []int{0, 1, ChallengeSize - 1, ChallengeSize + 1} {
		if _, _, err := DecodeChallenge(make([]byte, n)); err == nil {
			t.Errorf("DecodeChallenge accepted %d bytes", n)
		}
	}
}

func FuzzDecodeChallenge(f *testing.F) {
	tr := transcript()
	b := EncodeChallenge(tr.AcceptorNonce, tr.MAC([]byte("k"), Acceptor))
	f.Add(b[:])
	f.Add([]byte{})
	f.Add(make([]byte, ChallengeSize+1))
	f.Fuzz(func(t *testing.T, data []byte) {
		nonce, mac, err := DecodeChallenge(data)
		if err != nil {
			return
		}
		again := EncodeChallenge(nonce, mac)
		if !bytes.Equal(again[:], data) {
			t.Fatalf("round trip changed %x into %x", data, again)
		}
		// A forged challenge never verifies under a key it was not made with.
		if tr.Verify([]byte("k2"), Acceptor, mac[:]) == nil {
			t.Fatal("a decoded MAC verified under the wrong key")
		}
	})
}
