package persist

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// File names. A record's file name is derived from its key alone, so that a
// key can never name a path outside the store's directory and two keys never
// share a file, also on case-insensitive file systems (macOS, Windows):
//
//   - a key of up to maxEncodedKey bytes is stored as "k-" + its bytes in
//     lower-case base32hex without padding + ".json"; the name gives the key
//     back even when the file's content is unreadable;
//   - a longer key is stored as "h-" + the hex SHA-256 of the key + ".json",
//     so that the name stays under the usual 255-byte limit.
//
// Temporary files start with tempPrefix and are never records.
const (
	maxEncodedKey = 150 // 240 bytes of base32: with prefix and suffix, under 255
	encodedPrefix = "k-"
	hashedPrefix  = "h-"
	recordSuffix  = ".json"
	tempPrefix    = ".tmp-"
	lockName      = "LOCK"
)

var keyEncoding = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// fileName returns the name of the file that holds the record for key.
func fileName(key string) string {
	if len(key) <= maxEncodedKey {
		return encodedPrefix + keyEncoding.EncodeToString([]byte(key)) + recordSuffix
	}
	sum := sha256.Sum256([]byte(key))
	return hashedPrefix + hex.EncodeToString(sum[:]) + recordSuffix
}

// isRecordName reports whether name is the name of a record file.
func isRecordName(name string) bool {
	return strings.HasSuffix(name, recordSuffix) &&
		(strings.HasPrefix(name, encodedPrefix) || strings.HasPrefix(name, hashedPrefix))
}

// keyFromName returns the key a record file name encodes, or "" if the name
// holds only a hash of it (or is not a valid name).
func keyFromName(name string) string {
	enc, ok := strings.CutPrefix(name, encodedPrefix)
	if !ok {
		return ""
	}
	enc, ok = strings.CutSuffix(enc, recordSuffix)
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
	if fileName(r.Key) != name {
		return nil, errors.New("the key inside does not belong to this file name")
	}
	return r, nil
}
