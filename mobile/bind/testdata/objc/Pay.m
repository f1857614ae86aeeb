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

	MobileIntentList *left = [client unresolved:&err];
	for (int64_t i = 0; i < [left len]; i++) {
		MobileIntentInfo *in = [left get:i];
		MobileResult *r = [client settle:[in key] cancel:nil error:&err];
		NSLog(@"%@: %@", [in name], [r outcome]);
	}

	MobileCancel *cancel = [[MobileCancel alloc] init];
	MobileResult *res = [client pay:@"checkout:cart-42" path:@"/payments" body:body cancel:cancel error:&err];
	if (res == nil) {
		if ([MobileErrorKind([err localizedDescription]) isEqualToString:@"canceled"]) {
			return;
		}
		NSLog(@"%@", err);
		return;
	}
	NSString *outcome = [res outcome];
	if ([outcome isEqualToString:MobileOutcomeSucceeded]) {
		showReceipt([res body]);
	} else if ([outcome isEqualToString:MobileOutcomeFailed]) {
		showDeclined([res problemType]);
	} else if ([outcome isEqualToString:MobileOutcomeVoid]) {
		showNotPaid();
	} else if ([outcome isEqualToString:MobileOutcomeRejected]) {
		reportBug([res problemType]);
	} else {
		showPending([res key]); // blocked, expired or unknown
	}
}
