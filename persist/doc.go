/*
Package persist stores idem's intents on the device. An intent's
Idempotency-Key and exact request bytes so outlive crashes and restarts.

The client writes a [Record] durably before the first attempt is sent. A
[Store] makes each Write durable before it returns. The client writes the
record again when the outcome is known, with [WithDeferredSync]. A
[FileStore] then writes it at once and makes it durable in the
background. So a successful intent costs one durable write on the path
the user waits on. A power loss just before that sync leaves the intent
unresolved. Resuming it with its key gets the server's replay of the
same answer (see "The outcome's save" below).

Two stores are provided. [FileStore], opened with [OpenDir], is the
default for mobile and command-line clients. The store of [NewMemory] is
for tests, and for apps that accept losing their intents on a restart.
Both pass the conformance suite in package persisttest. Other
implementations of Store should run it too. Every change a Store makes
is conditional (see One writer per action). [PruneFunc] deletes the
resolved intents an app chooses from any Store.

# Durability

When [FileStore.Write] returns nil, the record survives kill -9 and
power loss. Write takes three steps:

 1. It writes the record to a new temporary file (".tmp-*") and fsyncs
    it.
 2. It renames that file over the record's file. The rename replaces the
    old version atomically. A reader sees the old file or the new one,
    never a mix.
 3. It fsyncs the directory, so that the rename is on stable storage.
    Writes running at once share this step. One sync serves every rename
    made before it started.

A crash before step 2 leaves the previous version and a stray temporary
file, which OpenDir removes. A crash after it leaves the new version.
git updates its refs the same way. One record per file keeps a damaged
record from taking others with it. Rename is the one atomic replacement
every POSIX file system offers. On Darwin, Go's File.Sync issues
F_FULLFSYNC, which flushes the drive's cache too. On Windows, package os
cannot sync a directory. There the rename's durability rests on NTFS's
metadata journal, which was not tested here.

A record keeps its file for life, whatever its state. So a Write costs
two fsyncs. A record keeps its Name too, which its file's name carries.
A Write that would change it is refused, so a key never has two files.

A Write with [WithDeferredSync] of a record already stored takes the
first two steps before it returns. The directory sync runs in the
background, and Close waits for it. Until then, a power loss leaves the
new file or the old one, whole. It never leaves neither, nor a damaged
file. A record written for the first time is always synced before Write
returns. When OpenDir creates the directory, it syncs its parent too.
TestCrash (process death) and TestPowerCut (a file system that forgets
what was not synced) check all of this.

# The outcome's save

The save before the first attempt must be durable: losing it loses the
key. That key is the only way to ask the server what became of the
payment. Losing the outcome costs much less. The client resends with the
same key, and the server answers from its stored record. The answer is
the same status, headers and body, with no second charge. Only a power
loss or a kernel crash in the moments before the background sync loses
it. The kill of the process, the common crash on a phone, does not. The
root package's TestProcessCrashes checks that after every SIGKILL.

After such a power loss the app finds the intent unresolved. What it
showed the user stays true. Do gets the same answer again, the payment's
id included. Only the stored Attempts and the Replayed flag differ. The
resend must reach the server while it still holds the key. The client
sends a key until its retention less a safety margin (23 of 24 hours by
default). After that only Reconcile, a lookup by key, settles the
intent. Suppose the device stays off for a day after the power loss.
Suppose too that the server's lookup forgets payments with their keys.
Then Reconcile finds nothing and marks the paid intent void. An app that
cannot accept even so rare a case should have its store ignore
WithDeferredSync. That costs one more durable write per payment.

# File layout

A store's directory holds:

	k-<key>.<tag>.json  the intent whose key is up to 143 bytes
	h-<hash>.<tag>.json the same, for a longer key
	.tmp-*              a save in progress, or left by a crash
	quarantine/         damaged files moved aside (see Damage)
	index               the unresolved intents, a cache (see The index)
	LOCK                the lock file (see Locking)

<key> is the lower-case base32hex of the key's bytes. <hash> is the hex
SHA-256 of a key over 143 bytes (keys may have 255). <tag> is the first
8 bytes of the SHA-256 of the intent's Name, in lower-case base32hex. So
no key can name a path outside the directory, and names stay under 255
bytes. Two keys never share a file, even on case-insensitive file
systems. Even when the file is unreadable, its name tells the key (when
spelled out). It also tells which action the intent may belong to. A
List for one Name reads only the files tagged with it. A file whose name
starts as a record's but spells no key or no tag is a stray file. It is
reported as damage (see Damage). The store writes one file per key. A
second one may come from a backup or a copy. Then neither file is
trusted. Each is damage of the action its name tags. So neither action
takes a new intent. Quarantine the file that is not the intent. The
other is then the key's record. The store ignores other files in the
directory.

Each file is one JSON object: a Record with its format version. JSON
would change bytes that are not UTF-8. So Write refuses a Key, a Name or
a request header that is not UTF-8, and stores nothing. Its error says
which. Decoding validates the record ([Record.Validate]). It also checks that the key and
name inside belong to the file's name. The store reads only regular
files, never through a link. The read stops at the file's size when
opened. A FIFO or a device in a record's place is damage, found at once.
One in the index's place makes OpenDir list the directory. A file that
fails gives a [*CorruptError]. The error names the file and, as far as it is known,
the key.

# The index

The store keeps the unresolved records in memory, and nothing else. It
reads a resolved record from its file when asked for it. Listing 10,000
names and reading 1,000 files would take tens of milliseconds at start.
So [OpenDir] starts from the index when it can. The index is one file.
It holds the unresolved records and their files' stamps, in a flat
binary encoding, with a CRC-32C. It holds how many entries the directory had, too. OpenDir reads
it and stamps the unresolved files, one stat each. It neither lists the
directory nor reads a record file.

OpenDir then lists the directory in the background. Some calls wait for
that listing: every change, a List not restricted to unresolved records,
and a Get of a key the index does not hold. Every file the index does
not hold is a resolved record, unless the directory holds more entries
than the index counted. Then someone put files there by hand, and the
store reads those files. A List of unresolved records made before the
listing ends does not see such a file. A tool that puts record files in
the directory should remove the index. The next OpenDir then scans. A
scan reads every file, once. A resolved file rewritten in place, as a
restore from a backup does, is not read again: the index does not stamp
resolved files, so that OpenDir stays one stat per unresolved file. Keep
the directory out of backups, or remove the index after a restore.

The index is a cache, never the record. The record files stay the only
truth. The index exists only while it describes them.

  - The store writes it when at rest. That is after a full scan at
    OpenDir and at Close. It is also after the directory sync of
    deferred saves, so that an app killed after an intent resolved
    starts from it. The store syncs the directory first. So every change
    the index describes is durable before it. A change made while the
    index is written makes the store give that index up.
  - The first change of a record removes the index, before the change.
    The directory sync that makes the change durable makes the removal
    durable too. So a crash after a change leaves no index, and the next
    OpenDir scans. The index costs no durable write on the path of a
    Write.
  - A file rewritten in place changes its stamp: inode, size,
    modification and change times. That may be damage, or a hand edit.
    The index holds a record only with the stamp its file had when the
    store wrote or read it. A file whose stamp differs is read again. So
    the index never hides damage, which is reported as a
    [*CorruptError]. Clocks are coarse. So a file whose change time is
    not before the index's own is read again too. A missing file makes
    the index unusable.
  - Every record in the index must be unresolved. It must belong to the
    file it is filed under, as a record read from that file must. The
    store does not use an index damaged past its checksum, or copied from
    another store.
  - A damaged index, one of another version or one cut short is rebuilt
    by a full scan. It is never an error of OpenDir.

On Linux, Android, Darwin and the BSDs, the stamps hold the change time
(ctime), which no program can set. On other systems (Windows) the change
time is the modification time, and there is no inode. There a file
rewritten in place to the same size, its modification time set back, is
not seen to change.

# Permissions

OpenDir creates the directory with mode 0700 and every file with 0600:
bodies may hold card tokens or personal data. It refuses a directory that
gives group or others some access, and never changes its mode (see
[OpenDir]). Apps that must not keep response bodies at rest set
[Options].DiscardResponseBodies.

# Locking

A FileStore holds an exclusive lock on its directory from OpenDir to
Close. A second OpenDir fails at once with [ErrLocked]. Two writers
could interleave versions of an intent, and a store that keeps what it
read in memory must be the only writer.

On Linux, Android, Darwin (macOS, iOS) and the BSDs, the lock is flock(2)
on the directory itself. No one can remove that from under the holder.
The store takes flock(2) on the file LOCK in it as well. Builds from
before the directory lock took that lock alone. So a process of such a
build and one of this build never open one directory at once. On
Windows, the lock is LockFileEx on the file LOCK. The holder keeps LOCK
open without sharing deletion, so it cannot be removed either. On other
systems, it is a lock on LOCK through github.com/gofrs/flock. There,
removing that file while the store is open would let a second store in.
The lock goes with the process, so a crash leaves no stale lock. Locks on
network file systems are unreliable, so keep the store on a local disk.
Within a process, a FileStore is safe for concurrent use.

# Damage

The store reports a record that cannot be read as a [*CorruptError]. It
never repairs it, and deletes nothing because of it. Write and Delete
refuse it, as it has no version to compare. [FileStore.List] says which
damaged files it reports. With [Filter].Name set, it leaves out the
damaged files of other actions, told by their names' tags. So one bad
file stops only the action it may belong to. To find every damaged
file, List with the zero Filter. [FileStore.Quarantine] moves one aside,
durably, into the directory's quarantine subdirectory. Look at the file
first: it may hold a payment whose outcome is unknown.

A failed write (a full disk, a read-only directory) fails the Write. Its
error names the intent and the directory. The previous version stays
intact, and the store removes the temporary file. The client then sends
nothing.

# One writer per action

Every change is conditional, and the Store interface carries it (see
[Store]): [Claim] writes an action's new intent, [SaveIf] and [DeleteIf]
change a record only while it is the version read. So two clients
sharing the store cannot both win. The loser gets a [*ConflictError]
holding the stored record. persisttest checks each rule, and that of two
racing writers one wins.

# Format version and migration

Every record carries the [FormatVersion] that wrote it. This release
writes and reads version 1. Format 1 is frozen: a change to it needs a
new FormatVersion (testdata/format1 holds its golden files). A later release that changes the encoding
will raise FormatVersion. It will read the versions before it, and write
its own on the next write. So records migrate one at a time. A crash
mid-migration leaves each record in one version or the other. A record
from a newer release gives a *CorruptError wrapping [ErrNewerVersion].
It is never read as an older one, nor overwritten. So an app downgraded
by mistake keeps its intents for the upgrade.

# Choice of engine

The file store is the default over an embedded database such as bbolt.
A damaged record costs one intent, not a database that may refuse to
open. The store needs no mmap and no compaction. A record is a JSON file
an engineer can read when reconciling a payment by hand. And with the
index, the cost at start grows with the unresolved intents alone.
docs/BENCHMARKS.md has the measurements.
*/
package persist
