package idem

import "net/url"

// attemptDone tells the attempt hook of the call's current attempt,
// adding what the call knows of it: the intent's name and URL, and how
// long the attempt took on the Client's clock.
func (st *call) attemptDone(a Attempt) {
	if st.c.onAttempt == nil {
		return
	}
	a.Name, a.URL = st.name, st.url
	if !st.began.IsZero() {
		a.Duration = max(0, st.c.clock.Now().Sub(st.began))
	}
	st.c.attemptDone(a)
}

// redactURL returns raw with any password in it replaced, as
// url.URL.Redacted does; raw itself if it does not parse.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Redacted()
}
