package idem

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/persist"
)

// lifeConfig is the part of a Client's settings that the steps read. The
// Client's settings embed it. It never changes after New.
type lifeConfig struct {
	store     persist.Store
	logger    *slog.Logger // nil: silent
	clock     clock.Clock
	retention time.Duration
	margin    time.Duration
	// maxElapsed is the MaxElapsed of the policy of a call made with a
	// context.
	maxElapsed func(context.Context) time.Duration
	answerRules
}

// logs reports whether the app's logger takes records of level under ctx.
func (c *lifeConfig) logs(ctx context.Context, level slog.Level) bool {
	return c.logger != nil && c.logger.Enabled(ctx, level)
}

// log logs to the app's logger, if it gave one.
func (c *lifeConfig) log(ctx context.Context, level slog.Level, msg string, args ...any) {
	if c.logger != nil {
		c.logger.Log(ctx, level, msg, args...)
	}
}
