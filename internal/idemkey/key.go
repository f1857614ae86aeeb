// Package idemkey parses the Idempotency-Key header field: the
// middleware of package idempotency, the fake servers and the contract
// checker's test servers read keys the same way.
package idemkey

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/dunglas/httpsfv"
	"github.com/google/uuid"
)

// header is the request header that carries the idempotency key
// (the one the idempotency middleware reads).
const header = "Idempotency-Key"

// MaxLen is the longest key accepted, in bytes.
const MaxLen = 255

var (
	// ErrMissing is returned by ParseHeader when the request carries no
	// Idempotency-Key.
	ErrMissing = errors.New("idempotency: Idempotency-Key header missing")
	// ErrInvalid is wrapped by every error for a key the server cannot
	// accept; the wrapping error says why.
	ErrInvalid = errors.New("idempotency: invalid Idempotency-Key")
)

// ParseKey parses one Idempotency-Key field value. It accepts the RFC 8941
// sf-string form of the IETF draft ("K", parsed with httpsfv; parameters are
// ignored as RFC 8941 asks) and the bare form deployed APIs use (K), and
// returns the same key for both. A key is 1 to 255 characters of visible
// ASCII (0x21-0x7E). Errors say what is wrong with the value.
func ParseKey(value string) (string, error) {
	key := value
	if len(value) > 0 && value[0] == '"' {
		item, err := httpsfv.UnmarshalItem([]string{value})
		if err != nil {
			return "", fmt.Errorf("%w: quoted value is not an RFC 8941 sf-string", ErrInvalid)
		}
		s, ok := item.Value.(string)
		if !ok {
			return "", fmt.Errorf("%w: quoted value is not an RFC 8941 sf-string", ErrInvalid)
		}
		key = s
	}
	switch {
	case len(key) == 0:
		return "", fmt.Errorf("%w: key is empty", ErrInvalid)
	case len(key) > MaxLen:
		return "", fmt.Errorf("%w: key is %d characters long, the limit is %d", ErrInvalid, len(key), MaxLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("%w: character %d is 0x%02x; only visible ASCII (0x21-0x7E) is allowed", ErrInvalid, i, c)
		}
	}
	return key, nil
}

// ParseHeader returns the request's idempotency key, in the form keys are
// compared in (see [Canonical]). It fails when there is no Idempotency-Key
// field (the request has none: h.Values is empty), and when there is more
// than one or the one there is not a key (see [ParseKey]). With
// requireUUID, the key must also be a UUID in its 36-character form
// (hex digits of either case).
func ParseHeader(h http.Header, requireUUID bool) (string, error) {
	vals := h.Values(header)
	switch len(vals) {
	case 0:
		return "", ErrMissing
	case 1:
	default:
		return "", fmt.Errorf("%w: the header appears %d times; send it once", ErrInvalid, len(vals))
	}
	key, err := ParseKey(vals[0])
	if err != nil {
		return "", err
	}
	if requireUUID && (len(key) != 36 || uuid.Validate(key) != nil) {
		return "", fmt.Errorf("%w: this server requires a UUID such as 8e03978e-40d5-43e8-bc93-6894a57f9324", ErrInvalid)
	}
	return Canonical(key, requireUUID), nil
}

// Canonical returns the form in which key is compared with other keys.
// In UUID mode (uuidMode), a UUID in its 36-character form is one key
// whatever the case of its hex digits: an iOS client sends
// UUID().uuidString in upper case, and a gateway on the way may lower it,
// so Canonical returns uuid.Parse(key).String(), in lower case. Otherwise,
// and for any other key, the key is compared byte for byte: Canonical
// returns it unchanged. The answer echoes the key as received, never this
// form.
func Canonical(key string, uuidMode bool) string {
	if !uuidMode || len(key) != 36 {
		return key
	}
	u, err := uuid.Parse(key)
	if err != nil {
		return key
	}
	return u.String()
}
