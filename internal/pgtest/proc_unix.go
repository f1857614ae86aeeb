//go:build unix

package pgtest

import (
	"os/exec"
	"syscall"
)

var interrupt = syscall.SIGINT // PostgreSQL's fast shutdown

var crash = syscall.SIGQUIT // PostgreSQL's immediate shutdown, as a crash

// apply makes cmd run as a.
func (a *account) apply(cmd *exec.Cmd) {
	if a == nil {
		return
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(a.uid), Gid: uint32(a.gid)}}
}
