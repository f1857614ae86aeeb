//go:build !unix

package pgtest

import (
	"errors"
	"os"
	"os/exec"
)

var interrupt = os.Kill

var crash = os.Kill

// apply does nothing: outside unix the server runs as the current user.
func (a *account) apply(*exec.Cmd) {}

var errNoSignals = errors.New("pgtest: pausing a process needs unix signals")

func pause(int) error  { return errNoSignals }
func resume(int) error { return errNoSignals }
func kill(int) error   { return errNoSignals }
