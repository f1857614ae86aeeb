package idem

// Arm arms an intent as its first Do does, without sending it: the state
// of an app that crashed between the tap's write and the first byte.
var Arm = (*Client).arm
