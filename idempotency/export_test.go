package idempotency

import (
	"fmt"
	"strings"
)

// MemoryAtRest returns everything s holds about its records, as text, for
// the conformance suite's look at what a store keeps.
func MemoryAtRest(s *MemoryStore) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for id, r := range s.recs {
		fmt.Fprintf(&b, "%q %+v", id, *r)
		if r.Response != nil {
			fmt.Fprintf(&b, " %+v %q", r.Response.Header, r.Response.Body)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

type FullError = fullError

// The fingerprint's names that only this package's external tests use.
var (
	NewFingerprint       = newFingerprint
	ErrJSONTooDeep       = errJSONTooDeep
	ErrJSONDuplicateName = errJSONDuplicateName
	ErrJSONNotUTF8       = errJSONNotUTF8
)

const DefaultMaxDepth = defaultMaxDepth

// The fingerprint's type and version, for the external tests.
type Fingerprint = fingerprint

const FingerprintVersion = fingerprintVersion

// The problem types and defaults the external tests check answers against.
const (
	TypeBadRequest        = typeBadRequest
	TypeRequestIncomplete = typeRequestIncomplete
	TypeStorageFull       = typeStorageFull
	TypeInternal          = typeInternal
	TypeKeyReused         = typeKeyReused

	TypeUnsupportedMediaType = typeUnsupportedMediaType
	TypePayloadTooLarge      = typePayloadTooLarge
	DefaultLease             = defaultLease
	DefaultRetention         = defaultRetention
)

const (
	HeaderKey      = headerKey
	HeaderReplayed = headerReplayed

	HeaderBodyOmitted         = headerBodyOmitted
	DefaultMaxStoredBodyBytes = defaultMaxStoredBodyBytes
)
