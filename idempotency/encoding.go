package idempotency

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// acceptEncoding lists the content codings the middleware decodes. A
// 415's Accept-Encoding names them (RFC 9110, section 15.5.16).
const acceptEncoding = "gzip, deflate"

// maxCodings is the most codings a body may carry, identity aside.
// Clients send one. Each more multiplies the work an outsider can ask
// for. So a longer list is refused.
const maxCodings = 2

var (
	// errUnsupportedEncoding is wrapped by decodeContent's error for a
	// coding it does not know, or too many of them. It is a 415.
	errUnsupportedEncoding = errors.New("unsupported Content-Encoding")
	// errDecodedTooLarge is wrapped by decodeContent's error for a body
	// that decodes past the limit. It is a 413.
	errDecodedTooLarge = errors.New("decoded body too large")
	// errBadEncoding is wrapped by decodeContent's error for a body that
	// is not what its coding says. It is a 400.
	errBadEncoding = errors.New("the body does not decode as its Content-Encoding says")
)

// decodeContent undoes the Content-Encoding codings of a request body.
// The fingerprint must be of what the request means, not of how it was
// compressed. gzip writes the time and the compressor's settings in its
// output. So a retry compressed again differs byte for byte.
//
// The field values list codings, comma-separated, in the order they were
// applied. They are undone last first. gzip (or x-gzip) and deflate
// (zlib, RFC 9110 section 8.4.1.2) are known. identity changes nothing.
// Names are matched in any case. Each decoded stage is bounded by limit
// bytes. So a small compressed body cannot make the server hold a large
// one.
func decodeContent(codings []string, body []byte, limit int64) ([]byte, error) {
	var list []string
	for _, v := range codings {
		for c := range strings.SplitSeq(v, ",") {
			c = strings.ToLower(strings.TrimSpace(c))
			switch c {
			case "", "identity":
				continue
			case "gzip", "x-gzip", "deflate":
			default:
				return nil, fmt.Errorf("%w: %q; this server decodes %s", errUnsupportedEncoding, clip(c), acceptEncoding)
			}
			list = append(list, c)
		}
	}
	if len(list) > maxCodings {
		return nil, fmt.Errorf("%w: %d codings; this server decodes at most %d", errUnsupportedEncoding, len(list), maxCodings)
	}
	if len(body) == 0 {
		return body, nil
	}
	for i := len(list) - 1; i >= 0; i-- {
		var (
			zr  io.ReadCloser
			err error
		)
		if list[i] == "deflate" {
			zr, err = zlib.NewReader(bytes.NewReader(body))
		} else {
			zr, err = gzip.NewReader(bytes.NewReader(body))
		}
		if err != nil {
			return nil, fmt.Errorf("%w: it is not %s data", errBadEncoding, list[i])
		}
		out, err := io.ReadAll(io.LimitReader(zr, limit+1))
		_ = zr.Close()
		switch {
		case int64(len(out)) > limit:
			return nil, fmt.Errorf("%w: the request body decodes to more than %d bytes", errDecodedTooLarge, limit)
		case err != nil:
			return nil, fmt.Errorf("%w: it is not %s data", errBadEncoding, list[i])
		}
		body = out
	}
	return body, nil
}

// charsetProblem returns the 415 for a JSON body in a charset other than
// UTF-8, and nil for any other. JSON is UTF-8 (RFC 8259, section 8.1).
// The fingerprint reads a body's bytes as UTF-8. A body declared in
// another charset means other characters. So it is refused rather than
// fingerprinted as something it does not say. A body is JSON when its
// media type says so (application/json, or a +json suffix). It is also
// JSON when it parses as JSON (isJSON).
func charsetProblem(contentType string, isJSON bool) *Problem {
	if !strings.Contains(contentType, ";") {
		return nil // no parameters, so no charset
	}
	mediaType, params, err := mime.ParseMediaType(contentType)
	charset, declared := params["charset"]
	if err != nil {
		// Parameters that do not parse may hide a charset.
		declared = strings.Contains(strings.ToLower(contentType), "charset")
	}
	if !declared || err == nil && strings.EqualFold(charset, "utf-8") {
		return nil
	}
	if !isJSON && mediaType != "application/json" && !strings.HasSuffix(mediaType, "+json") {
		return nil // not JSON: fingerprinted raw, whatever its charset
	}
	return &Problem{Type: typeUnsupportedMediaType, Title: "Unsupported Media Type", Status: http.StatusUnsupportedMediaType,
		Detail: fmt.Sprintf("a JSON body must be UTF-8 (RFC 8259), and the Content-Type %q declares another charset; send it as UTF-8, with charset=utf-8 or no charset", clip(contentType))}
}

// clip shortens a request's field value quoted in a problem's detail.
// The answer to a long header need not carry it back whole.
func clip(s string) string {
	const most = 64
	if len(s) <= most {
		return s
	}
	return s[:most] + "..."
}

// decoded returns r as its handler sees it once its body is decoded. It
// is the same request, with the decoded length and no Content-Encoding.
// The header is copied, so r itself is left as it came.
func decoded(r *http.Request, n int) *http.Request {
	d := new(http.Request)
	*d = *r
	d.Header = r.Header.Clone()
	d.Header.Del("Content-Encoding")
	if d.Header.Get("Content-Length") != "" {
		d.Header.Set("Content-Length", strconv.Itoa(n))
	}
	d.ContentLength = int64(n)
	return d
}

// encodingProblem is the answer to a body decodeContent refused.
func encodingProblem(w http.ResponseWriter, err error) *Problem {
	switch {
	case errors.Is(err, errUnsupportedEncoding):
		w.Header().Set("Accept-Encoding", acceptEncoding)
		return &Problem{Type: typeUnsupportedMediaType, Title: "Unsupported Media Type", Status: http.StatusUnsupportedMediaType,
			Detail: err.Error()}
	case errors.Is(err, errDecodedTooLarge):
		return &Problem{Type: typePayloadTooLarge, Title: "Payload too large", Status: http.StatusRequestEntityTooLarge,
			Detail: err.Error()}
	}
	return &Problem{Type: typeBadRequest, Title: "Bad request", Status: http.StatusBadRequest, Detail: err.Error()}
}
