// Package bind holds the gomobile tooling of idem's mobile facade. It is a
// module of its own, so that golang.org/x/mobile stays out of idem's
// go.mod. Its tests generate the Java and Objective-C bindings of
// github.com/idemkit/idem/mobile with gobind. They fail on any member
// gobind skips. They compile the Java and run a smoke test in a real JVM,
// against a host build of the JNI library. See bind_test.go.
package bind

import (
	// The package bound, and the runtime its generated Go code imports.
	_ "github.com/idemkit/idem/mobile"
	_ "golang.org/x/mobile/bind"
)
