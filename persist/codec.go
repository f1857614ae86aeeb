package persist

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// File names: stem + "." + tag + ".json", as docs/PERSIST.md's "File
// layout" tells. The stem spells the key ("k-", base32hex) or, for a key
// over maxEncodedKey bytes, hashes it ("h-", hex SHA-256). The tag is the
// first 8 bytes of the SHA-256 of the record's Name, in base32hex.
// Temporary files start with tempPrefix and are never records.
const (
	maxEncodedKey = 143 // 229 bytes of base32: with prefix, tag and suffix, 250
	encodedPrefix = "k-"
	hashedPrefix  = "h-"
	tagLen        = 13
	fileSuffix    = ".json"
	tempPrefix    = ".tmp-"
	quarantineDir = "quarantine"
)

var keyEncoding = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// stem returns the part of a record's file name that depends on its key.
// It is also the key's identity among the store's entries.
func stem(key string) string {
	if len(key) <= maxEncodedKey {
		return encodedPrefix + keyEncoding.EncodeToString([]byte(key))
	}
	sum := sha256.Sum256([]byte(key))
	return hashedPrefix + hex.EncodeToString(sum[:])
}

// nameTag returns the tag of the action name in a record's file name.
func nameTag(name string) string {
	sum := sha256.Sum256([]byte(name))
	return keyEncoding.EncodeToString(sum[:8])
}

// fileName returns the name of the file that holds the record for key and
// name.
func fileName(key, name string) string {
	return stem(key) + "." + nameTag(name) + fileSuffix
}

// parsedName is what a record file's name says about the record.
type parsedName struct {
	// id is stem(key) of the record's key, or "" for a stray file. A
	// stray file's name looks like a record's but spells no key or no
	// tag. No store wrote it.
	id string
	// tag is the tag of the record's Name, or "" if the name carries none.
	tag string
}

// key returns the record's key when the name spells it (a "k-" name),
// else "". A listing never needs it. So it is decoded only here.
func (p parsedName) key() string {
	enc, ok := strings.CutPrefix(p.id, encodedPrefix)
	if !ok {
		return ""
	}
	b, _ := keyEncoding.DecodeString(enc) // parseName checked the spelling
	return string(b)
}

// parseName parses a file name of the store's directory. ok is false if
// the name is not a record file's. Stray files (see parsedName.id) have
// record file names.
func parseName(name string) (p parsedName, ok bool) {
	if !strings.HasPrefix(name, encodedPrefix) && !strings.HasPrefix(name, hashedPrefix) {
		return p, false
	}
	rest, ok := strings.CutSuffix(name, fileSuffix)
	if !ok {
		return p, false
	}
	keyPart, tag, _ := strings.Cut(rest, ".")
	if len(tag) != tagLen || !canonical(tag) {
		return parsedName{}, true // stray
	}
	p.tag = tag
	if enc, ok := strings.CutPrefix(keyPart, encodedPrefix); ok {
		// 1 to maxEncodedKey bytes, in the encoding's one spelling. The
		// key is decoded only when asked for (see key).
		if n := len(enc) * 5 / 8; n == 0 || n > maxEncodedKey || !canonical(enc) {
			return parsedName{}, true // stray
		}
		p.id = keyPart
		return p, true
	}
	h := strings.TrimPrefix(keyPart, hashedPrefix)
	if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size || hex.EncodeToString(b) != h {
		return parsedName{}, true // stray
	}
	p.id = keyPart
	return p, true
}

// canonical reports whether s is base32 as keyEncoding writes it: its
// letters, a length an encoding can have, and zero bits past the last
// byte. Each encoding then has one spelling, so one file name per key.
// It spares a listing the encoding of each name back.
func canonical(s string) bool {
	n := len(s)
	switch n % 8 {
	case 1, 3, 6:
		return false
	}
	v := 0
	for i := range n {
		switch c := s[i]; {
		case '0' <= c && c <= '9':
			v = int(c - '0')
		case 'a' <= c && c <= 'v':
			v = int(c-'a') + 10
		default:
			return false
		}
	}
	spare := n * 5 % 8 // bits of the last letter past the last byte
	return n == 0 || v&(1<<spare-1) == 0
}

// maxRecordFile bounds a record file's size. A file larger is damage: it
// is never read, so a damaged or hostile file (a sparse one costs no disk)
// cannot make the store allocate its size. A record holds one request's
// body and one answer's, which the app holds in memory too, base64 in
// JSON. 256 MiB is far above what an app on a device sends or keeps
// (Server.MaxResponseBytes bounds an answer), and below what ends an
// app's process. Write refuses a record that would not fit, so no record
// it writes is ever damage.
const maxRecordFile = 256 << 20

// encodeRecord returns the file content for r, which prepare returned.
func encodeRecord(r *Record) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("persist: cannot encode record %s: %w", r.Key, err)
	}
	if len(b)+1 > maxRecordFile {
		return nil, fmt.Errorf("persist: record %s takes %d bytes encoded, over the limit of %d for a record file; nothing was stored", r.Key, len(b)+1, maxRecordFile)
	}
	return append(b, '\n'), nil
}

// decodeRecord parses the content of a record file. It returns a record
// that passes Validate, in the form prepare gives, or an error. A record
// of a newer FormatVersion gives an error wrapping ErrNewerVersion. It is
// never read as one of this version. This release reads no other
// version.
func decodeRecord(data []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		// A newer release may have changed a field's type. Say so rather
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
	case r.Version != FormatVersion:
		return nil, fmt.Errorf("format version %d is not valid", r.Version)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	normalize(&r)
	return &r, nil
}

func newerVersion(v int) error {
	return fmt.Errorf("%w (format version %d; this release reads %d)", ErrNewerVersion, v, FormatVersion)
}

// decodeFile decodes the content of a record file whose name parsed as
// p. It checks that the key and name inside belong to that name.
func decodeFile(p parsedName, data []byte) (*Record, error) {
	r, err := decodeRecord(data)
	if err != nil {
		return nil, err
	}
	if err := belongs(p, r); err != nil {
		return nil, err
	}
	return r, nil
}

// belongs returns an error unless r's key and name belong to a file
// whose name parsed as p.
func belongs(p parsedName, r *Record) error {
	switch {
	case stem(r.Key) != p.id:
		return fmt.Errorf("the key inside (%q) does not belong to this file name", r.Key)
	case nameTag(r.Name) != p.tag:
		return fmt.Errorf("the name inside (%q) does not belong to this file name", r.Name)
	}
	return nil
}
