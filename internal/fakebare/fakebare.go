// Package fakebare gives cmd/idembench the fake server's API with POST
// /payments outside the idempotency layer, as a server without the
// contract would run it: every request does the work and charges, and
// nothing is replayed. It is the baseline that measures what the layer
// costs, with the same business handler, faults and counters as the fake
// server; clients are never tested against it, so it is not part of
// package fakeserver's API.
package fakebare

import "net/http"

// New returns the bare handler, a *fakeserver.Handler with defaults.
// Package fakeserver sets it as it initialises (this package cannot
// import fakeserver, which imports it): a program that calls it imports
// fakeserver too.
var New func() http.Handler
