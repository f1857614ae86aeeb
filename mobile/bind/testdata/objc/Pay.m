// The calls of mobile/README.md's Swift block, in Objective-C, compiled
// against the generated header: what Swift sees of the facade is what this
// file uses.
#import <Foundation/Foundation.h>
#import "Mobile.objc.h"

void showReceipt(NSData *body);
void showDeclined(NSString *problemType);
void showNotPaid(void);
void reportBug(NSString *problemType);
void showPending(NSString *key);
void showAlreadyPaid(NSString *key);
void showOffline(void);
void signIn(void);

// The app's Authorizer: an object of its own that conforms to the
// protocol, set as a field of the Config.
@interface SessionAuthorizer : NSObject <MobileAuthorizer>
@end

@implementation SessionAuthorizer
- (NSString *)authorize:(NSString *)key error:(NSError **)error {
	return @"Bearer token";
}
@end

void pay(NSString *dir, NSData *body) {
	MobileConfig *cfg = MobileNewConfig(dir, @"https://api.example.com");
	cfg.mark = @"echo";
	cfg.authorizer = [[SessionAuthorizer alloc] init];
	NSError *err = nil;
	MobileClient *client = MobileOpen(cfg, &err);
	if (client == nil) {
		NSLog(@"%@", [err localizedDescription]);
		return;
	}

	// Settle what an earlier run left, keeping what the user was told
	// was not sent.
	MobileResultList *left = [client settleAll:nil error:&err];
	for (int64_t i = 0; i < [left len]; i++) {
		MobileResult *r = [left get:i];
		NSLog(@"%@: %@ (%@)", [r key], [r outcome], [r kind]);
	}

	MobileCancel *cancel = [[MobileCancel alloc] init];
	MobileResult *res = [client pay:@"checkout:cart-42" path:@"/payments" body:body cancel:cancel error:&err];
	if (res == nil) {
		// The kind is read from the error itself, never its message.
		if ([MobileErrorKind(err) isEqualToString:MobileKindCanceled]) {
			return;
		}
		NSLog(@"%@", err);
		return;
	}
	NSString *outcome = [res outcome];
	if ([outcome isEqualToString:MobileOutcomeSucceeded]) {
		showReceipt([res body]);
	} else if ([outcome isEqualToString:MobileOutcomeAlreadyPaid]) {
		showAlreadyPaid([res key]);
	} else if ([outcome isEqualToString:MobileOutcomeFailed]) {
		showDeclined([res problemType]);
	} else if ([outcome isEqualToString:MobileOutcomeVoid]) {
		showNotPaid();
	} else if ([outcome isEqualToString:MobileOutcomeRejected]) {
		reportBug([res kind]); // key_reused, key_rejected or rejected
	} else if ([outcome isEqualToString:MobileOutcomeNotSent]) {
		if ([[res kind] isEqualToString:MobileKindAuthorizer]) {
			signIn();
		} else {
			showOffline();
		}
	} else {
		showPending([res key]); // blocked, expired or unknown
	}
}
