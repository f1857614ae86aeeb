// Package bind holds the gomobile tooling of idem's mobile facade in a
// module of its own, so that golang.org/x/mobile stays out of idem's
// go.mod. Its tests generate the Java and Objective-C bindings of
// github.com/idemkit/idem/mobile with gobind (a tool of this module, run as
// `go tool gobind`), fail on any member gobind skips, compile the Java, and
// run a Java smoke test in a real JVM against a host build of the JNI
// library; see bind_test.go.
package bind

import (
	// The package bound, and the runtime its generated Go code imports.
	_ "github.com/idemkit/idem/mobile"
	_ "golang.org/x/mobile/bind"
)
