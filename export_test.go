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

// Tracked returns how many intents c holds state for in memory.
func Tracked(c *Client) int {
	c.keys.mu.Lock()
	n := len(c.keys.unsent) + len(c.keys.dropped) + len(c.keys.created) + len(c.keys.lastSent)
	c.keys.mu.Unlock()
	c.actionMu.Lock()
	defer c.actionMu.Unlock()
	return n + len(c.unarmed)
}

// The bounds on Prune's tombstones.
const (
	TombstoneLifetime = tombstoneLifetime
	MaxTombstones     = maxTombstones
)
