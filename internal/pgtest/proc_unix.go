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

// pause stops process pid (SIGSTOP), resume continues it, and kill ends it
// at once (SIGKILL, which a stopped process obeys).
func pause(pid int) error  { return syscall.Kill(pid, syscall.SIGSTOP) }
func resume(pid int) error { return syscall.Kill(pid, syscall.SIGCONT) }
func kill(pid int) error   { return syscall.Kill(pid, syscall.SIGKILL) }
