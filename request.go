package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Request is what an intent sends, byte for byte, on every attempt.
type Request struct {
	// Method is POST or PATCH, the methods that carry an Idempotency-Key.
	Method string
	// URL is absolute.
	URL string
	// Header is resent on every attempt and stored with the intent. Keep
	// credentials out of it, and set them in the http.Client's transport.
	// Whatever is here is written to the device. A field net/http cannot
	// send is refused where the intent is made. (Its name is not a token, or
	// its value holds CR, LF or NUL.)
	Header http.Header
	// Body is sent unchanged on every attempt.
	Body []byte
}

// JSONRequest returns a Request whose body is v encoded as JSON. Its
// Content-Type is application/json. The bytes are fixed here, once, and
// every attempt sends exactly them.
func JSONRequest(method, url string, v any) (Request, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return Request{}, fmt.Errorf("idem: encoding request body: %w", err)
	}
	return Request{
		Method: method,
		URL:    url,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   body,
	}, nil
}

func (r Request) validate() error {
	switch r.Method {
	case http.MethodPost, http.MethodPatch:
	case "":
		return errors.New("idem: request has no method")
	default:
		return fmt.Errorf("idem: intents are for POST and PATCH, which carry an Idempotency-Key; %s is idempotent without one", r.Method)
	}
	u, err := url.Parse(r.URL)
	if err != nil {
		// Say why, without the URL, for what does not parse cannot be
		// redacted.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("idem: bad request URL: %w", err)
	}
	// The errors name the URL as the attempt hook does, with no credential.
	// It is redacted only for an error. A valid request, as every one
	// through the RoundTripper is, is not parsed again.
	shown := func() string { return redactUserinfo(r.URL, true) }
	if !u.IsAbs() || u.Host == "" {
		return fmt.Errorf("idem: request URL %q is not absolute", shown())
	}
	// What would make every attempt fail before it reaches a server is
	// refused here, before the intent exists.
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("idem: request URL %q: the scheme must be http or https", shown())
	}
	if u.Hostname() == "" {
		return fmt.Errorf("idem: request URL %q has no host name", shown())
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("idem: request URL %q: port %q is not 1-65535", shown(), p)
		}
	}
	if err := checkHeader(r.Header); err != nil {
		return err
	}
	return checkUTF8(r.Header)
}

// checkOwnKey refuses a key field of the app's, in any spelling. Each
// attempt carries its own key. The app's would go beside it, and a server
// might read that one.
func checkOwnKey(h http.Header) error {
	for field := range h {
		if strings.EqualFold(field, "Idempotency-Key") {
			return fmt.Errorf("idem: the request's header has an Idempotency-Key field (%q); idem sends its own key with each attempt, so give the request without it", field)
		}
	}
	return nil
}

// checkUTF8 refuses a header value that is not UTF-8. The store keeps
// the request as JSON, which would change those bytes. A resend would
// then differ from the first send. The error names the field only.
func checkUTF8(h http.Header) error {
	for name, values := range h {
		for _, v := range values {
			if !utf8.ValidString(v) {
				return fmt.Errorf("idem: request header field %q has a value that is not valid UTF-8, which the device store cannot keep as sent; give it in UTF-8 or percent-encode its bytes", name)
			}
		}
	}
	return nil
}

// checkHeader refuses a header net/http would refuse before it dials.
// net/http would refuse it on every attempt. The error names the field,
// never its value, which may be a credential.
func checkHeader(h http.Header) error {
	for name, values := range h {
		if !validFieldName(name) {
			return fmt.Errorf("idem: request header field name %q is not a token (RFC 9110)", name)
		}
		for _, v := range values {
			if !validFieldValue(v) {
				return fmt.Errorf("idem: request header field %q has a value with a control character (such as CR, LF or NUL): net/http cannot send it", name)
			}
		}
	}
	return nil
}

// errBadFieldValue is the Authorizer's failure when its value could not be
// sent. It never shows the value, for that is a credential.
var errBadFieldValue = errors.New("its value is not a valid header field value: it has a control character (such as CR, LF or NUL)")

// validFieldValue reports whether v holds no control character but space and
// tab. RFC 9110's field-value grammar asks that, and net/http sends that.
func validFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}

// validFieldName reports a header field name: a non-empty RFC 9110 token.
func validFieldName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		b := name[i]
		switch {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0:
		default:
			return false
		}
	}
	return true
}

// fingerprint identifies a request's method, URL and body. Two requests with
// the same fingerprint are the same intent.
func (r Request) fingerprint() string {
	h := sha256.New()
	h.Write([]byte(r.Method))
	h.Write([]byte{0})
	h.Write([]byte(r.URL))
	h.Write([]byte{0})
	h.Write(r.Body)
	var sum [sha256.Size]byte
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], h.Sum(sum[:0]))
	return string(out[:])
}
