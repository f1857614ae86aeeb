package mobile

import "github.com/idemkit/idem"

// IntentInfo describes an intent on the device.
type IntentInfo struct {
	Key  string
	Name string
	// State is the intent's state: new, pending, succeeded, failed,
	// rejected, expired, void or not_sent.
	State string
	// CreatedAtMillis is the creation time, in Unix milliseconds.
	CreatedAtMillis int64
}

func infoOf(in *idem.Intent) *IntentInfo {
	return &IntentInfo{
		Key:             in.Key(),
		Name:            in.Name(),
		State:           string(in.State()),
		CreatedAtMillis: in.CreatedAt().UnixMilli(),
	}
}

// IntentList is a list of intents, as gobind binds no slices of structs.
type IntentList struct {
	items []*IntentInfo
}

// Len is the number of intents.
func (l *IntentList) Len() int64 { return int64(len(l.items)) }

// Get returns the i-th intent, or nil when i is out of range.
func (l *IntentList) Get(i int64) *IntentInfo {
	if i < 0 || i >= int64(len(l.items)) {
		return nil
	}
	return l.items[i]
}

// ResultList is the Results of SettleAll, one per intent, oldest first.
type ResultList struct {
	items      []*Result
	unreadable string
}

// Len is the number of Results.
func (l *ResultList) Len() int64 { return int64(len(l.items)) }

// Get returns the i-th Result, or nil when i is out of range.
func (l *ResultList) Get(i int64) *Result {
	if i < 0 || i >= int64(len(l.items)) {
		return nil
	}
	return l.items[i]
}

// Unreadable is "" when every stored intent could be read; otherwise the
// storage error that names the ones that could not, which were not
// settled.
func (l *ResultList) Unreadable() string { return l.unreadable }
