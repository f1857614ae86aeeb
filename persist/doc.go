/*
Package persist stores idem's intents on the device, so that an intent's
Idempotency-Key and exact request bytes outlive crashes and restarts.

The client writes a [Record] before the first attempt is sent, durably: a
[Store] makes each Write durable before it returns. It writes it again when
the outcome is known, with [WithDeferredSync]: a [FileStore] writes it at
once and makes it durable in the background, so that a successful intent
costs one durable write on the path the user waits on. A power loss in the moments before that sync
leaves the intent unresolved, and resuming it with its key gets the
server's replay of the same answer (see "The outcome's save" below).

Two stores are provided. [FileStore], opened with [OpenDir], is the default
for mobile and command-line clients. The store of [NewMemory] is for
tests, and for apps that accept losing their intents on a restart. Both
pass the conformance suite in package persisttest, which other
implementations of Store should run too. Every change a Store makes is
conditional (see One writer per action). [PruneFunc] deletes the resolved
intents an app chooses from any Store.

# Durability

When [FileStore.Write] returns nil, the record survives kill -9 and power
loss. Write

 1. writes the record to a new temporary file (".tmp-*") in the store's
    directory and fsyncs it, so its bytes are on stable storage;
 2. renames it over the record's file, which atomically replaces the old
    version: a reader sees the old file or the new one, never a mix;
 3. fsyncs the directory, so the rename itself is on stable storage.
    Writes running at once share this step: a Write waits for a sync of
    the directory that started after its rename, and one sync serves all
    the renames made before it started.

A crash before step 2 leaves the previous version and a stray temporary
file, which OpenDir removes; a crash after it leaves the new version. This is
the usual scheme (git updates its refs this way): one record per file keeps
a damaged record from taking others with it, and rename is the one atomic
replacement every POSIX file system offers. On Darwin Go's File.Sync issues
F_FULLFSYNC, which also flushes the drive's cache. On Windows the
directory cannot be synced through package os, so the rename's durability
rests on NTFS's metadata journal; this was neither tested nor proven here.

A record keeps its file for life, whatever its state: a Write costs two
fsyncs. A record keeps its Name too, which its file's name carries: a
Write that would change it is refused, so a key never has two files.

A Write with [WithDeferredSync] on a FileStore, of a record already
stored under the same file name, takes the first two steps before it
returns. The directory sync runs in the background, and Close waits for
it. Until then a power loss leaves the new file, whole, or the old one:
never neither and never a damaged file. A record written for the first
time is written as without the hint. When OpenDir creates the directory
it syncs its parent, so the directory outlives a power cut too.
TestCrash (process death) and TestPowerCut (a file system that forgets
what was not synced) check all of this; their comments say how.

# The outcome's save

Why may the save of an intent's outcome wait for its sync, when the save
before the first attempt may not? Because what a lost outcome costs is a
resend with the same key, which the server answers with its stored record:
the same status, headers and body (Idempotent-Replayed: true), no second
charge. A lost creation costs the key itself, and with it the only way to
ask the server what became of the payment. And the outcome is lost only to
a power loss (or a kernel crash) in the moments between Do returning and
the background sync: the kill of the process, the common crash on a phone,
leaves it written, as TestProcessCrashes in the root package checks after
every SIGKILL.

After such a power loss the app finds the intent unresolved, and what it
showed the user stays true: Unresolved lists it, and Do gets the same
answer again, the payment's id included. Only the stored Attempts and the
Replayed flag differ. The resend must reach the server while it still
holds the key: the client sends a key until its retention less a safety
margin (23 of 24 hours by default), after which the server's sweep may
delete it. An intent not resumed by then is expired, and only Reconcile,
a lookup by key, settles it. That is the one case where the deferred sync
matters: a device that loses power within moments of a payment and is not
opened again for a day, against a server whose lookup forgets payments
with their keys (the fake server's does not). Then Reconcile finds
nothing and marks the intent void, though it was paid. An app that cannot
accept that even so rare a case should have its store ignore
WithDeferredSync, at one more durable write per payment.

# File layout

A store's directory holds:

	k-<key>.<tag>.json  the intent whose key is up to 143 bytes
	h-<hash>.<tag>.json the same, for a longer key
	.tmp-*              a save in progress, or left by a crash
	quarantine/         damaged files moved aside (see Damage)
	index               the unresolved intents, a cache (see The index)
	LOCK                the lock file (see Locking)

<key> is the lower-case base32hex of the key's bytes, <hash> the hex
SHA-256 of a key over 143 bytes (keys may have 255), and <tag> the first 8
bytes of the SHA-256 of the intent's Name, in lower-case base32hex. So no
key can name a path outside the directory, names stay under 255 bytes, and
two keys never share a file, even on case-insensitive file systems. The
name tells, even when the file is unreadable, the intent's key (when
spelled out) and which action it may belong to. A List for one Name reads
only the files tagged with it. A file whose name starts as a record's but
spells no key or no tag is a stray file, reported as damage (see Damage),
and so is a second file of one key.
Other files in the directory are ignored.

Each file is one JSON object: a Record with its format version. Decoding
validates the record ([Record.Validate]) and checks that the key and name
inside belong to the file's name; a file that fails gives a
[*CorruptError] naming the file and, as far as it is known, the key.

# The index

The store keeps the unresolved records in memory, and nothing else: a
resolved record is read from its file when asked for. Listing a
directory of 10,000 names and reading 1,000 files takes tens of
milliseconds, which an app would wait for at start. So [OpenDir] starts,
when it can, from the index: one file, holding the unresolved records
and their files' stamps in gob with a CRC-32C, and
how many entries the directory held. OpenDir then reads that file and
stamps the unresolved files (one stat each), but neither lists the
directory nor reads a record file. It lists the directory in the
background after it returns: a Get of a key the index does not hold, a
List not restricted to unresolved records, and every change wait for
that listing. Every file the index does not hold is then a resolved
record, unless the directory holds more entries than the index counted
(a file put there by hand): then those files are read. A List of
unresolved records made before the listing ends does not see such a
file; a tool that puts record files in the directory removes the index,
so that the next OpenDir scans. A scan without the index reads every
file, once.

The index is a cache, never the record: the record files stay the only
truth, and the index exists only while it describes them.

  - It is written when the store is at rest: after a full scan at
    OpenDir, in the background after the directory sync of deferred
    saves (when an intent resolves, so that an app killed afterwards
    starts from it), and at Close. The store syncs the directory first,
    so every change the index describes is durable before it. A change
    made while the index is written makes the store give it up.
  - The first change of a record after that removes the index, before
    the change. Both are entries of the store's directory, so the
    directory sync that makes the change durable makes the removal
    durable too. A crash after a change leaves no index, and the next
    OpenDir scans. The index costs no durable write on the path of a
    Write.
  - A file rewritten in place (damage, or a hand edit) changes its own
    stamp (inode, size, modification and change times). The index holds
    a record only with the stamp its file had when the store wrote or
    read it, so a file whose stamp differs is read again: damage is
    reported as a [*CorruptError], never hidden by the index. Clocks are
    coarse, so a file whose change time is not before the index's own is
    read again too. A missing file makes the index unusable.
  - Every record in the index must be unresolved and belong to the file
    it is filed under, as a record read from its file must: an index
    damaged past its checksum, or copied from another store, is not
    used.
  - An index that is damaged, of another version or cut short is
    rebuilt by a full scan; it is never an error of OpenDir.

On Linux, Android, Darwin and the BSDs the stamps hold the change time
(ctime), which no program can set. On other systems (Windows) the change
time is the modification time and there is no inode, so a file rewritten
in place to the same size with its modification time set back is not
seen to change.

# Permissions

OpenDir creates the directory with mode 0700 and every file with 0600:
stored bodies may hold card tokens or personal data. If the directory exists
and gives group or others any access, OpenDir refuses, with an error that
names the directory and its mode, instead of changing the mode of a
directory it did not create: chmod it 0700 or pass a new directory (for example a subdirectory of
the app's data directory). Apps that must not keep response bodies at rest
set [Options].DiscardResponseBodies.

# Locking

A FileStore holds an exclusive lock on its directory from OpenDir to
Close. A second OpenDir of the directory, from this process or another,
fails at once with an error matching [ErrLocked] that names the directory:
two writers could interleave versions of an intent, and a store that keeps
what it read in memory must be the only writer.

On Linux, Android, Darwin (macOS, iOS) and the BSDs the lock is flock(2) on
the directory itself, which no one can remove from under the holder, and
flock(2) on the file LOCK in it, which the builds before the directory
itself was locked took alone: so a process of such a build and one of
this build never open one directory at once. On
Windows it is LockFileEx on the file LOCK, which the holder keeps open
without sharing deletion, so it cannot be removed either; on other systems
it is a lock on LOCK through github.com/gofrs/flock, and removing that file
while the store is open would let a second store in. The lock goes with the
process, so a crash leaves no stale lock. Locks on network file systems are
unreliable; keep the store on a local disk. Within a process a FileStore is
safe for concurrent use.

# Damage

A record that cannot be read is reported, never repaired, and nothing is
deleted because of it. [FileStore.Get] returns its *CorruptError and
[FileStore.Write] refuses to overwrite it, and [FileStore.Delete] to
delete it: it has no version to compare. [FileStore.List] returns the
readable records it selects together with a *CorruptError for each damaged
file that may hold a record it selects. With [Filter].Name set, the
damaged files of other actions (by their names' tags) are neither read nor
reported, so one bad file stops only the action it may belong to (in
idem's client, Client.Intent for that name). A damaged file may hold an
unresolved record, so a List of unresolved records reports it, unless the
index showed it held a resolved one. A stray file, whose name looks like
a record's but spells no key or no tag, is reported only when Filter.Name
is empty. [CorruptErrors] returns every *CorruptError of the joined
error, where errors.As finds only the first.

To find every damaged file, List with the zero Filter. [FileStore.Quarantine]
moves one aside, into the directory's quarantine subdirectory, durably; the
store then no longer sees it, and the intent it held, if any, is gone from
the store until the app writes it again. Before that, the app or its
engineer should look at the file: it may hold a payment whose outcome is
unknown.

A failed write (a full disk, a read-only directory) fails the Write with an
error naming the intent and the directory, leaves the previous version
intact and removes its temporary file; the client then sends nothing.

# One writer per action

Every change is conditional, and the Store interface carries it: it has
one write method and one delete, and no unconditional save a wrapper
could override alone. Write with no old version writes a new intent, the
latest of its action: no record has its key, and every record of its
Name has a lower Seq ([Claim]). Write with an old version, and Delete,
change a record only while it is that version ([SaveIf], [DeleteIf]).
Check and change are one step, so two clients sharing the store cannot
both make an intent for one action, and a client that takes over an armed
intent to send it and the client that armed it cannot both win; the loser
gets a [*ConflictError] holding the stored record. A version is a
record's Rev, set by its writer to a new value ([NewRev]) before each
write: a writer that lost the answer of its write reads the record back
and knows by the Rev whether it landed ([SameVersion]). persisttest
checks each of these rules, and that of two racing writers one wins.

# Format version and migration

Every record carries the [FormatVersion] that wrote it; this release
writes and reads version 1. A later release that changes the encoding
raises FormatVersion, reads the versions before it and writes its own on
the next write, so records migrate one at a time and a crash
mid-migration leaves each record in one version or the other. A record
from a newer release gives a *CorruptError wrapping [ErrNewerVersion] and
is never read as an older one nor overwritten: an app downgraded by
mistake keeps its intents for the upgrade.

# Choice of engine

The file store is the default over an embedded database such as bbolt: a
damaged record costs one intent, not a database that may refuse to open; it
needs no mmap and no compaction; a record is a JSON file an engineer can
read when reconciling a payment by hand; and, with the index, the cost at
start grows with the unresolved intents alone. docs/BENCHMARKS.md has the
measurements.
*/
package persist
