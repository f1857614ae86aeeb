// Package mobile is idem for Android and iOS apps, through gomobile.
//
// gobind binds only signed integers, float64, bool, string, []byte, error,
// pointers to exported structs and interfaces of those; idem's own API uses
// contexts, functional options, time types and http.Header, which it skips.
// This package is a facade whose every exported member binds, so that a
// Kotlin or Swift app can pay, settle at start and cancel from any thread:
//
//	cfg := mobile.NewConfig(stateDir, "https://api.example.com")
//	cfg.Mark = "echo" // how the server marks its answers: required
//	client, err := mobile.Open(cfg)
//	res, err := client.Pay("checkout:cart-42", "/payments", body, nil)
//	switch res.Outcome { case mobile.OutcomeSucceeded: ... }
//
// Bind it from the mobile/bind directory, a module of its own whose go.mod
// requires golang.org/x/mobile (idem's own go.mod does not, so gomobile
// fails from the repository's root):
//
//	cd mobile/bind
//	gomobile bind -target=android -androidapi 21 -o idem.aar github.com/idemkit/idem/mobile
//
// mobile/README.md shows the calls from Kotlin and Swift and says what CI
// checks of the generated code.
//
// # Results and errors
//
// Every call that talks to the server returns a [Result] whose Outcome says
// what became of the intent: succeeded, already paid (the action was paid
// earlier with another request; nothing was sent), failed (a final
// business answer such as a declined card), rejected (the server refused
// the request or its key), not sent, unknown (no final answer yet: settle
// it later, never pay anew), expired (too old to send again: Settle asks
// the server's lookup), void (the server never did it: a new payment is
// safe) or blocked (an earlier intent for the same action is unresolved;
// the Result names its key). Its Kind says how the call ended, finer where
// there is more to say: the key reused, the key refused, a write the
// device could not make, an Authorizer that threw.
//
// An error is returned only for problems on the device: the state
// directory is in use, storage failed before anything was sent, the input
// is wrong, the client is closed, the call was cancelled (the intent keeps
// its state).
// gobind turns a Go error into an exception that carries only its
// message; pass the exception itself to [ErrorKind], which gets the Go
// error back and reads its kind. No kind is parsed from a message.
//
// # Threads
//
// Every call blocks until it is done: call it off the UI thread. A
// [Cancel] handle passed to a call stops it from any other thread. The
// [Listener] is called on a goroutine of its own, never on the caller's
// thread, and a slow listener never slows a call: events it cannot keep up
// with are dropped.
//
// # Memory
//
// gobind passes a []byte argument without copying: it points into memory
// the JVM releases when the call returns. The facade copies every byte
// slice it keeps, and an empty body, which arrives as nil, is sent as an
// empty body.
package mobile
