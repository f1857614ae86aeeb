package pgstore

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHeaderJSON(t *testing.T) {
	t.Run("it writes what json.Marshal writes, for every header", func(t *testing.T) {
		for _, h := range []http.Header{
			nil,
			{},
			{"Content-Type": {"application/json"}},
			{"Location": {"/payments/pay_1"}, "Content-Type": {"application/json"}},
			{"Z": {"1"}, "A": {"2"}, "M": {"3", "4"}, "B": {}},
			{"Idempotency-Body-Omitted": {"too-large"}, "Location": {"/p"}, "Content-Type": {"text/plain; charset=utf-8"}},
			{"A": {"1"}, "B": {"2"}, "C": {"3"}, "D": {"4"}, "E": {"5"}}, // more keys than are sorted in place
			{"A": nil},
			{"A": {`quo"te`}, "B": {`back\slash`}},
			{"A": {"<script>&"}},
			{"A": {"tab\there", "new\nline", "del\x7f"}},
			{"A": {"caf\u00e9", "line\u2028sep", "bad\xffutf8"}},
			{"K\u00e9y": {"v"}},
		} {
			want, err := json.Marshal(h)
			require.NoError(t, err)
			got, err := headerJSON(h)
			require.NoError(t, err)
			require.Equal(t, string(want), got, "header %q", h)
		}
	})
	t.Run("a long header is written whole", func(t *testing.T) {
		long := make([]byte, 1000)
		for i := range long {
			long[i] = 'a' + byte(i%26)
		}
		h := http.Header{"Location": {string(long)}, "Content-Type": {"application/json"}}
		want, _ := json.Marshal(h)
		got, err := headerJSON(h)
		require.NoError(t, err)
		require.Equal(t, string(want), got)
	})
}
