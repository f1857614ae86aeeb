// Package mobile is idem for Android and iOS apps, through gomobile.
//
// gobind skips much of idem's own API, such as contexts, options and time
// types. This package is a facade whose every exported member binds. So a
// Kotlin or Swift app can pay, settle at start and cancel from any thread:
//
//	cfg := mobile.NewConfig(stateDir, "https://api.example.com")
//	cfg.Mark = "echo" // how the server marks its answers: required
//	client, err := mobile.Open(cfg)
//	res, err := client.Pay("checkout:cart-42", "/payments", body, nil)
//	switch res.Outcome { case mobile.OutcomeSucceeded: ... }
//
// Bind it from the mobile/bind directory. That is a module of its own,
// whose go.mod requires golang.org/x/mobile. From the repository's root
// gomobile fails.
//
//	cd mobile/bind
//	gomobile bind -target=android -androidapi 21 -o idem.aar github.com/idemkit/idem/mobile
//
// mobile/README.md shows the calls from Kotlin and Swift. It says what CI
// checks of the generated code.
//
// # Results and errors
//
// Every call that talks to the server returns a [Result]. Its Outcome
// says what became of the intent; see the Outcome constants. Its Kind says
// how the call ended, finer where there is more to say.
//
// An error is returned only for problems on the device. [ErrorKind] lists
// their kinds. gobind turns a Go error into an exception that carries
// only its message. Pass the exception itself to [ErrorKind] to read its
// kind. Never parse a kind from a message.
//
// # Threads
//
// Every call blocks until it is done, so call it off the UI thread. A
// [Cancel] handle passed to a call stops it from any other thread. The
// [Listener] is called on a goroutine of its own, never on the caller's
// thread. A slow listener never slows a call. Events it cannot keep up
// with are dropped.
//
// # Memory
//
// gobind passes a []byte argument without copying. So the facade copies
// every byte slice it keeps. An empty body, which arrives as nil, is sent
// as an empty body.
package mobile
