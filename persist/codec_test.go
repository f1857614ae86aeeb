package persist

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func validRecord() *Record {
	return &Record{
		Version: FormatVersion, Key: "k1", KeyHeader: `"k1"`, Seq: 7, Method: "POST", URL: "https://x/pay",
		Header:    map[string][]string{"Content-Type": {"application/json"}},
		Body:      []byte(`{"amount":1}`),
		CreatedAt: time.Date(2026, 3, 1, 12, 0, 0, 5, time.UTC), State: StateSucceeded,
		Response: &Response{StatusCode: 201, Body: []byte("ok"), Replayed: true},
	}
}

// decodeTests are the unit cases of decodeRecord and the seeds of
// FuzzDecodeRecord.
var decodeTests = []struct {
	name    string
	data    string
	wantErr error // nil: any error; ignored when ok
	ok      bool
}{
	{"valid", mustEncode(validRecord()), nil, true},
	{"valid, offset time", `{"version":1,"key":"k","method":"POST","url":"/p","state":"new","created_at":"2026-03-01T13:00:00+01:00"}`, nil, true},
	{"unknown field", `{"version":1,"key":"k","method":"POST","url":"/p","state":"new","created_at":"2026-03-01T12:00:00Z","later":true}`, nil, true},
	{"empty", ``, nil, false},
	{"null", `null`, nil, false},
	{"array", `[]`, nil, false},
	{"empty object", `{}`, nil, false},
	{"truncated", mustEncode(validRecord())[:40], nil, false},
	{"trailing garbage", mustEncode(validRecord()) + "x", nil, false},
	{"no version", `{"key":"k","method":"POST","url":"/p","state":"new","created_at":"2026-03-01T12:00:00Z"}`, nil, false},
	{"negative version", `{"version":-1,"key":"k","method":"POST","url":"/p","state":"new","created_at":"2026-03-01T12:00:00Z"}`, nil, false},
	{"without key header and sequence", `{"version":1,"key":"k","method":"POST","url":"/p","state":"new","created_at":"2026-03-01T12:00:00Z"}`, nil, true},
	{"older version", `{"version":0,"key":"k","method":"POST","url":"/p","state":"new","created_at":"2026-03-01T12:00:00Z"}`, nil, false},
	{"key header with a line break", `{"version":1,"key":"k","key_header":"k\r\nX: y","method":"POST","url":"/p","state":"new","created_at":"2026-03-01T12:00:00Z"}`, nil, false},
	{"newer version", `{"version":2,"key":"k","method":"POST","url":"/p","state":"new","created_at":"2026-03-01T12:00:00Z"}`, ErrNewerVersion, false},
	{"newer version, other types", `{"version":9,"key":[1],"state":{}}`, ErrNewerVersion, false},
	{"bad state", `{"version":1,"key":"k","method":"POST","url":"/p","state":"done","created_at":"2026-03-01T12:00:00Z"}`, nil, false},
	{"no key", `{"version":1,"method":"POST","url":"/p","state":"new","created_at":"2026-03-01T12:00:00Z"}`, nil, false},
	{"no time", `{"version":1,"key":"k","method":"POST","url":"/p","state":"new"}`, nil, false},
	{"bad time", `{"version":1,"key":"k","method":"POST","url":"/p","state":"new","created_at":"yesterday"}`, nil, false},
	{"bad body", `{"version":1,"key":"k","method":"POST","url":"/p","state":"new","created_at":"2026-03-01T12:00:00Z","body":"!!"}`, nil, false},
	{"version as string", `{"version":"1","key":"k","method":"POST","url":"/p","state":"new","created_at":"2026-03-01T12:00:00Z"}`, nil, false},
}

func mustEncode(r *Record) string {
	b, err := encodeRecord(r)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestRecordFile: a record's file name and content give the record
// back, or a clear error.
func TestRecordFile(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"a file's content decodes or says why not", decodeRecordCases},
		{"a record comes back from its encoding", encodeDecodeRoundTrip},
		{"a file name tells the key and action or is a stray", parseNameCases},
		{"a CorruptError names the file and says what to do", corruptErrorMessage},
		{"a key's name has one spelling", canonicalSpelling},
	} {
		t.Run(c.name, c.run)
	}
}

// canonicalSpelling checks canonical against the encoding itself, for
// every string of up to three letters of the alphabet and a few others.
func canonicalSpelling(t *testing.T) {
	t.Parallel()
	letters := "0123456789abcdefghijklmnopqrstuvwxyzA="
	words := []string{""}
	for range 3 {
		for _, w := range words {
			for _, c := range letters {
				words = append(words, w+string(c))
			}
		}
	}
	words = append(words, keyEncoding.EncodeToString([]byte("6f1c2a4e-9b7d-4e3a")), "0000000000001", "0000000000002")
	for _, w := range words {
		b, err := keyEncoding.DecodeString(w)
		want := err == nil && keyEncoding.EncodeToString(b) == w
		if canonical(w) != want {
			t.Errorf("canonical(%q) = %v, want %v", w, !want, want)
		}
	}
}

func decodeRecordCases(t *testing.T) {
	t.Parallel()
	for _, tt := range decodeTests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := decodeRecord([]byte(tt.data))
			if tt.ok {
				require.NoError(t, err)
				assert.NoError(t, r.Validate())
				return
			}
			assert.Nil(t, r)
			require.Error(t, err)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
			} else {
				assert.NotErrorIs(t, err, ErrNewerVersion)
			}
		})
	}
}

func encodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	want := prepare(validRecord(), Options{})
	data, err := encodeRecord(want)
	require.NoError(t, err)
	got, err := decodeRecord(data)
	require.NoError(t, err)
	assert.Equal(t, want, got, "what prepare gives survives encoding exactly")
}

// FuzzDecodeRecord checks that decoding never panics and either fails or
// gives a valid record of a version this release reads, which encodes and
// decodes again to itself.
func FuzzDecodeRecord(f *testing.F) {
	for _, tt := range decodeTests {
		f.Add([]byte(tt.data))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeRecord(data)
		if err != nil {
			if r != nil {
				t.Fatalf("record %+v with error %v", r, err)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("decoded an invalid record: %v", err)
		}
		if r.Version != FormatVersion {
			t.Fatalf("decoded version %d", r.Version)
		}
		again, err := encodeRecord(r)
		if err != nil {
			// Valid JSON times may lie outside what JSON can encode.
			return
		}
		r2, err := decodeRecord(again)
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		assert.Equal(t, r, r2)
	})
}

var nameTests = []string{
	"k", "K", "../../etc/passwd", "/", `a\b`, ".", "..", "\x00", "ünï", " ",
	strings.Repeat("x", maxEncodedKey), strings.Repeat("x", maxEncodedKey+1), strings.Repeat("é", 200),
}

// FuzzFileName checks that every key and name give one plain file name in
// the store's directory, under 255 bytes, that no other key gives, from
// which a short key can be read back, and whose tag tells the name apart
// from another.
func FuzzFileName(f *testing.F) {
	for _, k := range nameTests {
		f.Add(k, strings.ToUpper(k), "checkout:"+k, k)
	}
	f.Fuzz(func(t *testing.T, key, other, name, otherName string) {
		if key == "" {
			return
		}
		fn := fileName(key, name)
		p, ok := parseName(fn)
		if len(fn) > 255 || filepath.Base(fn) != fn || strings.ContainsAny(fn, `/\:`) ||
			!ok || p.id != stem(key) || p.tag != nameTag(name) ||
			strings.HasPrefix(fn, tempPrefix) || strings.HasPrefix(fn, quarantineDir) {
			t.Fatalf("key %q, name %q give file name %q, parsed as %+v", key, name, fn, p)
		}
		if fn != strings.ToLower(fn) {
			t.Fatalf("name %q is not lower case, so two keys may share it on a case-insensitive file system", fn)
		}
		if len(key) <= maxEncodedKey && p.key() != key {
			t.Fatalf("key %q from name %q: got %q", key, fn, p.key())
		}
		if other != key && fileName(other, name) == fn {
			t.Fatalf("keys %q and %q share name %q", key, other, fn)
		}
		e := &entry{name: fn, p: p}
		if other := (Filter{Name: otherName}); !e.mayHold(Filter{Name: name}, nameTag(name)) ||
			(otherName != name && otherName != "" && e.mayHold(other, nameTag(other.Name))) {
			t.Fatalf("file %q of name %q: may hold records of %q", fn, name, otherName)
		}
	})
}

func parseNameCases(t *testing.T) {
	t.Parallel()
	k := stem("k")
	tag := nameTag("checkout")
	tests := []struct {
		name string
		ok   bool
		want parsedName
	}{
		{k + "." + tag + ".json", true, parsedName{id: k, tag: tag}},
		{k + "." + tag + ".done.json", true, parsedName{}},                                                                     // stray: not a tag
		{stem(strings.Repeat("x", 150)) + "." + tag + ".json", true, parsedName{id: stem(strings.Repeat("x", 150)), tag: tag}}, // hashed
		{k + ".json", true, parsedName{}},                                                                                      // stray: no tag
		{stem(strings.Repeat("x", 150)) + ".json", true, parsedName{}},                                                         // stray: no tag
		{"k-" + keyEncoding.EncodeToString([]byte(strings.Repeat("x", 150))) + "." + tag + ".json", true, parsedName{}},        // stray: a key spelled out past maxEncodedKey
		{"k-!!.json", true, parsedName{}},                                                                                      // stray: no key
		{"k-.json", true, parsedName{}},                                                                                        // stray: empty key
		{strings.ToUpper(k) + ".json", false, parsedName{}},                                                                    // not a record file name
		{"k-" + strings.ToUpper(k[2:]) + ".json", true, parsedName{}},                                                          // stray: not the store's spelling
		{"h-abc.done.json", true, parsedName{}},                                                                                // stray: no hash
		{k + ".zz.json", true, parsedName{}},                                                                                   // stray: no tag
		{k + "." + tag + ".x.json", true, parsedName{}},                                                                        // stray
		{k + ".txt", false, parsedName{}},
		{"LOCK", false, parsedName{}},
		{".tmp-123", false, parsedName{}},
		{"quarantine", false, parsedName{}},
	}
	for _, tt := range tests {
		got, ok := parseName(tt.name)
		if ok != tt.ok || (ok && got != tt.want) {
			t.Errorf("parseName(%q) = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func corruptErrorMessage(t *testing.T) {
	t.Parallel()
	e := &CorruptError{Path: "/d/k-x.json", Key: "K1", Err: errors.New("invalid JSON")}
	assert.Contains(t, e.Error(), "/d/k-x.json")
	assert.Contains(t, e.Error(), `"K1"`)
	assert.Contains(t, e.Error(), "remove")
	newer := &CorruptError{Path: "/d/k-x.json", Key: "K1", Err: newerVersion(2)}
	assert.Contains(t, newer.Error(), "upgrade")
	assert.NotContains(t, newer.Error(), "remove", "a newer record must not be removed")
}

// FuzzIndexDecode: an index whose checksum holds may still be any bytes
// (copied from another build, or damaged before its checksum was taken).
// Decoding it gives an error or entries, never a panic.
func FuzzIndexDecode(f *testing.F) {
	r := prepare(validRecord(), Options{})
	good := encodeIndex(nameSet{n: 3}, []entry{{name: fileName(r.Key, r.Name), rec: r}, {name: "k-x.json"}})
	f.Add(good[len(indexMagic)+5:])
	f.Add([]byte{0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}) // a count past the index's end
	f.Add([]byte{1, 0x7f})                            // a known count below zero
	f.Fuzz(func(t *testing.T, body []byte) {
		_ = DecodeIndexBody(body)
	})
}
