// Command cart shows what idem does when the cart changes around a payment:
// an intent that was never sent is replaced silently, and one whose outcome
// is unknown is surfaced to the app, which settles it before a new payment
// starts. It runs against the fake server in process:
//
//	go run ./examples/cart
package main

import (
	"context"
	"fmt"
	"os"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "cart:", err)
		os.Exit(1)
	}
}
