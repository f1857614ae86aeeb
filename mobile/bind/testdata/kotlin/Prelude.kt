// Stand-ins for what mobile/README.md's Kotlin blocks take from Android and
// from the app, so that the blocks compile against the generated Java.

import java.io.File

class AppContext : android.content.Context() {
    val filesDir: File = File(".")
}

object Log {
    fun i(tag: String, msg: String) {
        println("$tag: $msg")
    }
}

fun showReceipt(body: ByteArray?) {}
fun showDeclined(problemType: String) {}
fun showNotPaid() {}
fun reportBug(problemType: String) {}
fun showPending(key: String) {}
fun showAlreadyPaid(key: String) {}
fun showOffline() {}
fun signIn() {}

object session {
    fun token(): String = "token"
}

class PaymentScreen {
    fun showRetrying(waitMillis: Long) {}
}

var paymentScreen: PaymentScreen? = null
