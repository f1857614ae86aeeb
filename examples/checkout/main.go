// Command checkout pays for an order through idem, with its intents saved
// under a state directory, and shows what a lost response and a crash do.
//
// With no flags it starts the fake server in process and runs the whole
// demonstration at once: a lost response that is retried with the same key,
// then a crash between send and answer and a restart that resumes the
// intent. With -server URL it pays through that server instead, and -crash
// makes the process die after the request was sent, so that the next run of
// the same command resumes the intent:
//
//	go run ./examples/checkout
//	go run ./cmd/fakeserver &   # then, twice:
//	go run ./examples/checkout -server http://127.0.0.1:8080 -crash
//
// Run it with -h for the flags.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "checkout:", err)
		os.Exit(exitCode(err))
	}
}
