package idem

import (
	"net/http"

	"github.com/dunglas/httpsfv"
)

// quoteKey spells key as an RFC 8941 sf-string.
func quoteKey(key string) string {
	v, err := httpsfv.Marshal(httpsfv.NewItem(key))
	if err != nil {
		// Keys are made of visible ASCII, which every sf-string can hold.
		return key
	}
	return v
}

// spells reports whether v is one of the two spellings of key, bare or
// quoted. A stored value that names another key is never sent.
func spells(v, key string) bool { return v == key || v == quoteKey(key) }

// echoes reports whether h carries key back in its Idempotency-Key field.
// The key may be bare or quoted. Any one field line that names the key is
// enough. A line that names another key is not the server's answer to this
// intent. key may itself be spelled quoted. (An app's own API client may put
// such a key on a request through the RoundTripper.) The two are compared as
// the server reads them.
func echoes(h http.Header, key string) bool {
	want := echoKey(key)
	if want == "" {
		return false
	}
	for _, v := range h.Values("Idempotency-Key") {
		if echoKey(v) == want {
			return true
		}
	}
	return false
}

// echoKey reads the key of one echoed value. That is the sf-string's content
// when quoted. Otherwise it is the value itself, as the server parses the
// request's.
func echoKey(v string) string {
	if len(v) > 0 && v[0] == '"' {
		item, err := httpsfv.UnmarshalItem([]string{v})
		if err != nil {
			return ""
		}
		s, _ := item.Value.(string)
		return s
	}
	return v
}
