//go:build !unix

package pgtest

import (
	"os"
	"os/exec"
)

var interrupt = os.Kill

var crash = os.Kill

// apply does nothing: outside unix the server runs as the current user.
func (a *account) apply(*exec.Cmd) {}
