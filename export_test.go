package idem

// Arm arms an intent as its first Do does, without sending it: the state
// of an app that crashed between the tap's write and the first byte.
var Arm = (*Client).arm

// Remembered returns how many live requests rt holds intents for.
func Remembered(rt any) int {
	t := rt.(*roundTripper)
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sent)
}
