package persist

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// File names. A record's file name is derived from its key, so that a key
// can never name a path outside the store's directory and two keys never
// share a file, also on case-insensitive file systems (macOS, Windows). The
// stem of the name is:
//
//   - for a key of up to maxEncodedKey bytes, "k-" + its bytes in lower-case
//     base32hex without padding; the name gives the key back even when the
//     file's content is unreadable;
//   - for a longer key, "h-" + the hex SHA-256 of the key, so that the name
//     stays under the usual 255-byte limit.
//
// The suffix tells whether the record is resolved: ".json" for an
// unresolved record, ".done.json" for a resolved one. OpenDir reads only the
// unresolved files, and the resolved ones when they are asked for.
//
// Temporary files start with tempPrefix and are never records.
const (
	maxEncodedKey  = 150 // 240 bytes of base32: with prefix and suffix, under 255
	encodedPrefix  = "k-"
	hashedPrefix   = "h-"
	openSuffix     = ".json"
	resolvedSuffix = ".done.json"
	tempPrefix     = ".tmp-"
	lockName       = "LOCK"
)

var keyEncoding = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// stem returns the part of a record's file name that depends on its key.
func stem(key string) string {
	if len(key) <= maxEncodedKey {
		return encodedPrefix + keyEncoding.EncodeToString([]byte(key))
	}
	sum := sha256.Sum256([]byte(key))
	return hashedPrefix + hex.EncodeToString(sum[:])
}

// fileName returns the name of the file that holds the record for key in
// the given resolution.
func fileName(key string, resolved bool) string {
	if resolved {
		return stem(key) + resolvedSuffix
	}
	return stem(key) + openSuffix
}

// parseName splits a record file name into its stem and resolution; ok is
// false if name is not a record file name.
func parseName(name string) (st string, resolved, ok bool) {
	if !strings.HasPrefix(name, encodedPrefix) && !strings.HasPrefix(name, hashedPrefix) {
		return "", false, false
	}
	if st, ok := strings.CutSuffix(name, resolvedSuffix); ok {
		return st, true, true
	}
	st, ok = strings.CutSuffix(name, openSuffix)
	return st, false, ok
}

// keyFromStem returns the key a stem encodes, or "" if the stem holds only
// a hash of it (or is not valid).
func keyFromStem(st string) string {
	enc, ok := strings.CutPrefix(st, encodedPrefix)
	if !ok {
		return ""
	}
	b, err := keyEncoding.DecodeString(enc)
	if err != nil {
		return ""
	}
	return string(b)
}

// encodeRecord returns the file content for r, which prepare returned.
func encodeRecord(r *Record) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("persist: cannot encode record %s: %w", r.Key, err)
	}
	return append(b, '\n'), nil
}

// decodeRecord parses the content of a record file. It returns a record
// that passes Validate, in the form prepare gives, or an error; records of a
// newer FormatVersion give an error wrapping ErrNewerVersion and are never
// read as if they were of this one.
func decodeRecord(data []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		// A newer release may have changed a field's type; say so rather
		// than report it as damage.
		var v struct {
			Version int `json:"version"`
		}
		if json.Unmarshal(data, &v) == nil && v.Version > FormatVersion {
			return nil, newerVersion(v.Version)
		}
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	switch {
	case r.Version > FormatVersion:
		return nil, newerVersion(r.Version)
	case r.Version < 1:
		return nil, fmt.Errorf("format version %d is not valid", r.Version)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	normalize(&r)
	return &r, nil
}

func newerVersion(v int) error {
	return fmt.Errorf("%w (format version %d; this release reads up to %d)", ErrNewerVersion, v, FormatVersion)
}

// decodeFile decodes the content of the record file name, and checks that
// the key inside is the one the name stands for.
func decodeFile(name string, data []byte) (*Record, error) {
	r, err := decodeRecord(data)
	if err != nil {
		return nil, err
	}
	if fileName(r.Key, r.State.Resolved()) != name {
		return nil, fmt.Errorf("the key and state inside (%q, %s) do not belong to this file name", r.Key, r.State)
	}
	return r, nil
}
