/*
Package persist stores idem's intents on the device. An intent's
Idempotency-Key and exact request bytes so outlive crashes and restarts.

Two stores are provided. [FileStore], opened with [OpenDir], is the
default for mobile and command-line clients. It keeps one JSON file per
intent, in a directory it locks from OpenDir to Close. The store of
[NewMemory] is for tests, and for apps that accept losing their intents
on a restart. Both pass the conformance suite in package persisttest.
Other implementations of [Store] should run it too. [PruneFunc] deletes
the resolved intents an app chooses from any Store.

# The promise of Write

A [Store] makes each Write durable before it returns. For a FileStore,
the record then survives kill -9 and power loss.

The client writes a [Record] durably before the first attempt is sent.
It writes the record again when the outcome is known, with
[WithDeferredSync]. A FileStore then writes it at once and makes it
durable in the background. So a successful intent costs one durable
write on the path the user waits on. A power loss just before that sync
leaves the intent unresolved. Resuming it with its key gets the
server's replay of the same answer.

Every change a Store makes is conditional. [Claim] writes an action's
new intent. [SaveIf] and [DeleteIf] change a record only while it is
the version read. So two clients sharing a store cannot both win. The
loser gets a [*ConflictError].

A record that cannot be read gives a [*CorruptError]. The store never
repairs it, and deletes nothing because of it. [FileStore.Quarantine]
moves it aside.

# More

docs/PERSIST.md in the repository tells the rest, section by section:
Durability, The outcome's save, File layout, The index, Permissions,
Locking, Damage, One writer per action, Format version and migration,
and Choice of engine.
*/
package persist
