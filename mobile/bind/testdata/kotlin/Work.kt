// Stand-ins for the part of androidx.work (WorkManager) that
// mobile/README.md's WorkManager block uses, with the library's names and
// signatures, so that the block compiles here. They check the facade's
// calls, not the library's API.
package androidx.work

import android.content.Context
import java.util.concurrent.TimeUnit

class WorkerParameters

abstract class ListenableWorker(val applicationContext: Context, params: WorkerParameters) {
    abstract class Result {
        companion object {
            fun success(): Result = object : Result() {}
            fun retry(): Result = object : Result() {}
            fun failure(): Result = object : Result() {}
        }
    }

    open fun onStopped() {}
}

abstract class Worker(context: Context, params: WorkerParameters) : ListenableWorker(context, params) {
    abstract fun doWork(): ListenableWorker.Result
}

enum class NetworkType { NOT_REQUIRED, CONNECTED, UNMETERED }

enum class BackoffPolicy { EXPONENTIAL, LINEAR }

enum class ExistingPeriodicWorkPolicy { KEEP, REPLACE, UPDATE }

class Constraints private constructor() {
    class Builder {
        fun setRequiredNetworkType(t: NetworkType): Builder = this
        fun build(): Constraints = Constraints()
    }
}

open class WorkRequest

class PeriodicWorkRequest : WorkRequest() {
    class Builder {
        fun setConstraints(c: Constraints): Builder = this
        fun setBackoffCriteria(p: BackoffPolicy, delay: Long, unit: TimeUnit): Builder = this
        fun build(): PeriodicWorkRequest = PeriodicWorkRequest()
    }
}

@Suppress("UNUSED_PARAMETER")
inline fun <reified W : ListenableWorker> PeriodicWorkRequestBuilder(repeatInterval: Long, unit: TimeUnit): PeriodicWorkRequest.Builder =
    PeriodicWorkRequest.Builder()

class WorkManager {
    fun enqueueUniquePeriodicWork(name: String, policy: ExistingPeriodicWorkPolicy, work: PeriodicWorkRequest) {}

    companion object {
        @JvmStatic
        fun getInstance(context: Context): WorkManager = WorkManager()
    }
}
