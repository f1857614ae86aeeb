package idempotency

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/dunglas/httpsfv"
	"github.com/google/uuid"
)

// headerKey is the request header that carries the idempotency key. The
// middleware echoes it on every answer to a keyed request.
const headerKey = "Idempotency-Key"

// headerReplayed is set to "true" on an answer replayed from a stored
// record. A fresh answer never carries it.
const headerReplayed = "Idempotent-Replayed"

// headerBodyOmitted is set on a replay whose record kept no body. It says
// why: "too-large" (over Config.MaxStoredBodyBytes) or "confidential"
// (Config.Confidential). The status, Location and Content-Type are the
// stored ones. The body is empty. A fresh answer never carries it.
const headerBodyOmitted = "Idempotent-Body-Omitted"

// maxKeyLen is the longest key accepted, in bytes.
const maxKeyLen = 255

var (
	// errKeyMissing is the error of parseKeyHeader when the request
	// carries no Idempotency-Key.
	errKeyMissing = errors.New("idempotency: Idempotency-Key header missing")
	// errKeyInvalid is wrapped by every error for a key the server cannot
	// accept. The wrapping error says why.
	errKeyInvalid = errors.New("idempotency: invalid Idempotency-Key")
)

// ParseKey parses one Idempotency-Key field value, as the middleware does.
// A server may serve its own lookup by key (see [MarkLookup]). It reads
// the key with ParseKey, then compares it in [CanonicalKey]'s form.
//
// It accepts the RFC 8941 sf-string form of the IETF draft ("K"). It
// also accepts the bare form deployed APIs use (K). It returns the same
// key for both. Parameters of an sf-string are ignored, as RFC 8941
// asks. A key is 1 to 255 characters of visible ASCII (0x21-0x7E).
// Errors say what is wrong with the value.
func ParseKey(value string) (string, error) {
	key := value
	if len(value) > 0 && value[0] == '"' {
		item, err := httpsfv.UnmarshalItem([]string{value})
		if err != nil {
			return "", fmt.Errorf("%w: quoted value is not an RFC 8941 sf-string", errKeyInvalid)
		}
		s, ok := item.Value.(string)
		if !ok {
			return "", fmt.Errorf("%w: quoted value is not an RFC 8941 sf-string", errKeyInvalid)
		}
		key = s
	}
	switch {
	case len(key) == 0:
		return "", fmt.Errorf("%w: key is empty", errKeyInvalid)
	case len(key) > maxKeyLen:
		return "", fmt.Errorf("%w: key is %d characters long, the limit is %d", errKeyInvalid, len(key), maxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("%w: character %d is 0x%02x; only visible ASCII (0x21-0x7E) is allowed", errKeyInvalid, i, c)
		}
	}
	return key, nil
}

// parseKeyHeader returns the request's idempotency key, in the form keys
// are compared in ([CanonicalKey]). It fails with errKeyMissing when
// there is no Idempotency-Key field. It fails with an error wrapping
// errKeyInvalid when there is more than one. It fails the same way when
// the one there is not a key ([ParseKey]). With requireUUID, the key
// must also be a UUID in its 36-character form. Its hex digits may be
// of either case.
func parseKeyHeader(h http.Header, requireUUID bool) (string, error) {
	vals := h.Values(headerKey)
	switch len(vals) {
	case 0:
		return "", errKeyMissing
	case 1:
	default:
		return "", fmt.Errorf("%w: the header appears %d times; send it once", errKeyInvalid, len(vals))
	}
	key, err := ParseKey(vals[0])
	if err != nil {
		return "", err
	}
	if requireUUID && (len(key) != 36 || uuid.Validate(key) != nil) {
		return "", fmt.Errorf("%w: this server requires a UUID such as 8e03978e-40d5-43e8-bc93-6894a57f9324", errKeyInvalid)
	}
	return CanonicalKey(key, requireUUID), nil
}

// CanonicalKey returns the form in which the middleware compares and
// stores key, as [ParseKey] returned it. requireUUID is the middleware's
// [Config.RequireUUID]. [ID.Key] holds this form.
//
// With requireUUID, a UUID in its 36-character form is one key whatever
// the case of its hex digits. An iOS client sends UUID().uuidString in
// upper case. A gateway on the way may lower it. So the form is
// uuid.Parse(key).String(), in lower case. Any other key, and every key
// without requireUUID, is compared byte for byte. It is returned
// unchanged. The answer echoes the key as received, never this form.
func CanonicalKey(key string, requireUUID bool) string {
	if !requireUUID || len(key) != 36 {
		return key
	}
	u, err := uuid.Parse(key)
	if err != nil {
		return key
	}
	return u.String()
}
