// Package auth turns a job's shared secret (config.Config.Secret) into the
// keys each plane proves membership with. It is pure: no sockets, no
// goroutines, no clock; the planes call it.
//
// Every key is derived from the secret with HKDF-SHA256 under its own
// purpose label, so that a key learnt for one use (a data-plane MAC, say)
// says nothing about the others, and the secret itself is never sent.
package auth

import (
	"crypto/hkdf"
	"crypto/sha256"
	"fmt"
)

// Derive returns n bytes of key material for purpose (a fixed label such
// as "fpt data hello v1") from secret. The same secret and purpose always
// give the same bytes.
func Derive(secret, purpose string, n int) ([]byte, error) {
	if secret == "" {
		return nil, fmt.Errorf("auth: no secret to derive %q from", purpose)
	}
	k, err := hkdf.Key(sha256.New, []byte(secret), nil, purpose, n)
	if err != nil {
		return nil, fmt.Errorf("auth: derive %q: %w", purpose, err)
	}
	return k, nil
}
