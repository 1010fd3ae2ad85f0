//! The two template pools (procurement and release engineering) and their small-talk fillers.

use super::domain::Template;

/// Procurement pool: requirements → sourcing → evaluation → contracting → ordering → closeout.
pub static PROCUREMENT: [Template; 18] = [
    // ---- phase 0: requirements and project setup ----
    Template {
        slug: "proc_technical_requirements",
        phase: 0,
        canonical: "gather the technical requirements from the lab teams",
        asks: [
            "Please gather the technical requirements from the lab teams",
            "Could you collect the lab teams' technical requirements for this purchase",
            "Time to pull together the technical requirements from each lab",
        ],
        premature: [
            "Let's get a head start and gather the technical requirements now",
            "No need to hold off, collect the technical requirements from the labs right away",
            "I'd like the technical requirements gathered today, even if we're jumping ahead",
        ],
        redo_probes: [
            "Make sure the technical requirements get gathered from the lab teams",
            "Can you handle collecting the technical requirements from the labs",
            "Don't forget to round up the technical requirements from the lab teams",
        ],
        status_question: "Where do we stand on the technical requirements from the lab teams?",
        legit_redo: "Two lab teams changed their specs after the first round, so please gather the technical requirements again",
        tool: "gather_technical_requirements",
    },
    Template {
        slug: "proc_budget_code",
        phase: 0,
        canonical: "set up the project budget code in the finance system",
        asks: [
            "Please set up the project budget code in the finance system",
            "Go ahead and create a budget code for this project in finance",
            "We need a project budget code opened in the finance system, take care of it",
        ],
        premature: [
            "Let's not wait, get the project budget code set up in finance now",
            "I know it's early, but open the budget code in the finance system right away",
            "Jump ahead and create the project budget code today",
        ],
        redo_probes: [
            "Make sure the project budget code exists in the finance system",
            "Can you take care of the budget code for this project",
            "Please get a budget code sorted for the project in finance",
        ],
        status_question: "Has the project budget code been set up in the finance system yet?",
        legit_redo: "Finance purged our budget code during their year-end cleanup, so please set it up again in the finance system",
        tool: "set_up_budget_code",
    },
    Template {
        slug: "proc_statement_of_work",
        phase: 0,
        canonical: "draft the statement of work for the vendors",
        asks: [
            "Please draft the statement of work for the vendors",
            "I need you to write up the statement of work we'll share with suppliers",
            "Time to put together a first statement of work for the bidders",
        ],
        premature: [
            "Let's get ahead of things and draft the statement of work now",
            "Don't wait on anything, start writing the statement of work right away",
            "I want the statement of work drafted today, let's move early",
        ],
        redo_probes: [
            "Make sure there's a statement of work written for the vendors",
            "Can you handle drafting the statement of work",
            "Don't forget the statement of work for the suppliers",
        ],
        status_question: "What's the status of the statement of work for the vendors?",
        legit_redo: "Legal rejected the template we used, so please draft the statement of work again on the new form",
        tool: "draft_statement_of_work",
    },
    // ---- phase 1: sourcing ----
    Template {
        slug: "proc_market_survey",
        phase: 1,
        canonical: "run the market survey of potential suppliers",
        asks: [
            "Please run the market survey of potential suppliers",
            "Go ahead and do a market survey to see which suppliers are out there",
            "Next up, carry out the market survey for this purchase",
        ],
        premature: [
            "Why wait, kick off the market survey of suppliers now",
            "I'd rather start the market survey today than sit around",
            "Skip the waiting and run the market survey right away",
        ],
        redo_probes: [
            "Make sure the market survey of potential suppliers gets done",
            "Can you take care of the market survey",
            "Could you look after the supplier market survey for us",
        ],
        status_question: "How is the market survey of potential suppliers coming along?",
        legit_redo: "Two major suppliers merged last week and the landscape changed, so please run the market survey again",
        tool: "run_market_survey",
    },
    Template {
        slug: "proc_rfq",
        phase: 1,
        canonical: "send the RFQ to the shortlisted vendors",
        asks: [
            "Send the RFQ out to the shortlisted vendors",
            "Please get the RFQ over to every vendor on the shortlist",
            "Go ahead and issue the RFQ to our shortlisted suppliers",
        ],
        premature: [
            "Let's not hold back, send the RFQ to the shortlisted vendors now",
            "I want the RFQ out the door today, go ahead and send it",
            "Why wait, get the RFQ to the vendors on the shortlist right away",
        ],
        redo_probes: [
            "Make sure the RFQ goes out to the shortlisted vendors",
            "Can you handle sending the RFQ to the shortlist",
            "Please see that the shortlisted vendors receive the RFQ",
        ],
        status_question: "Where are we with the RFQ to the shortlisted vendors?",
        legit_redo: "Half the vendors never received the RFQ because of a mail server bounce, so please send it out again",
        tool: "send_rfq",
    },
    Template {
        slug: "proc_bidder_briefing",
        phase: 1,
        canonical: "host the bidder briefing call",
        asks: [
            "Please host the bidder briefing call",
            "Could you run the briefing call for the bidders",
            "Time to hold the briefing call so bidders can ask their questions",
        ],
        premature: [
            "Let's not wait, set up and host the bidder briefing call now",
            "I'd like the bidder briefing call to happen today, go ahead",
            "Move early and hold the briefing call with the bidders right away",
        ],
        redo_probes: [
            "Make sure the bidder briefing call takes place",
            "Can you look after hosting the briefing call for bidders",
            "Don't let the bidder briefing call slip",
        ],
        status_question: "Did the bidder briefing call happen yet?",
        legit_redo: "The recording failed and two bidders missed the session, so please host the bidder briefing call again",
        tool: "host_bidder_briefing",
    },
    // ---- phase 2: evaluation and vendor selection ----
    Template {
        slug: "proc_bid_scoring",
        phase: 2,
        canonical: "score the vendor bids on the evaluation matrix",
        asks: [
            "Please score the vendor bids on the evaluation matrix",
            "Go ahead and rate each of the bids using the evaluation matrix",
            "Time to run the bids through our scoring matrix",
        ],
        premature: [
            "Let's not wait, start scoring the vendor bids now",
            "I want the bids scored today, go ahead and jump in",
            "Get a head start and score the bids on the matrix right away",
        ],
        redo_probes: [
            "Make sure the vendor bids get scored on the matrix",
            "Can you handle the scoring of the bids",
            "Please see that all the vendor bids are scored",
        ],
        status_question: "Where are we on scoring the vendor bids?",
        legit_redo: "We found a formula error in the evaluation matrix, so please score the vendor bids again",
        tool: "score_vendor_bids",
    },
    Template {
        slug: "proc_supplier_references",
        phase: 2,
        canonical: "check references for the top-ranked supplier",
        asks: [
            "Please check references for the top-ranked supplier",
            "I need you to call the top supplier's customer references",
            "Time to verify the references the leading supplier gave us",
        ],
        premature: [
            "No point waiting, start checking the supplier's references now",
            "I'd like the references for the top supplier checked today, go ahead",
            "Move early and phone the top-ranked supplier's references right away",
        ],
        redo_probes: [
            "Make sure the top-ranked supplier's references get checked",
            "Can you look after the supplier reference checks",
            "Don't forget to check the leading supplier's references",
        ],
        status_question: "Have the references for the top-ranked supplier been checked?",
        legit_redo: "One reference contact turned out to work for the supplier's own subsidiary, so please check the references again with independent customers",
        tool: "check_supplier_references",
    },
    Template {
        slug: "proc_award_memo",
        phase: 2,
        canonical: "write the vendor award memo",
        asks: [
            "Please write the vendor award memo",
            "Go ahead and draft the award memo explaining our vendor choice",
            "Time to put the vendor award memo on paper",
        ],
        premature: [
            "Let's not wait, write up the award memo now",
            "I'd like the vendor award memo done today, go ahead and start",
            "Get ahead of things and produce the award memo right away",
        ],
        redo_probes: [
            "Make sure the vendor award memo gets written",
            "Can you handle the award memo for the vendor decision",
            "Please see that there's an award memo on file",
        ],
        status_question: "Is the vendor award memo written yet?",
        legit_redo: "The director wants the award memo to include the cost comparison, so please write it again with that section",
        tool: "write_award_memo",
    },
    // ---- phase 3: contracting and finance ----
    Template {
        slug: "proc_final_pricing",
        phase: 3,
        canonical: "negotiate final pricing with the selected vendor",
        asks: [
            "Please negotiate final pricing with the selected vendor",
            "Go ahead and hammer out the final pricing with our chosen vendor",
            "Time to settle the final pricing with the vendor we picked",
        ],
        premature: [
            "Let's not wait, start negotiating final pricing with the vendor now",
            "I want the final pricing settled today, go ahead and push the vendor",
            "Jump the gun a bit and lock down pricing with the vendor right away",
        ],
        redo_probes: [
            "Make sure final pricing gets negotiated with the selected vendor",
            "Can you take care of the pricing negotiation with the vendor",
            "Please see that we have final pricing agreed with the vendor",
        ],
        status_question: "Where do we stand on final pricing with the selected vendor?",
        legit_redo: "The vendor withdrew its quote after a currency swing, so please negotiate final pricing again",
        tool: "negotiate_final_pricing",
    },
    Template {
        slug: "proc_master_service_agreement",
        phase: 3,
        canonical: "sign the master service agreement",
        asks: [
            "Please sign the master service agreement",
            "Go ahead and execute the master service agreement with the vendor",
            "Time to get our signature on the master service agreement",
        ],
        premature: [
            "No sense waiting, sign the master service agreement now",
            "I want the master service agreement signed today, go ahead",
            "Move early and put pen to the master service agreement right away",
        ],
        redo_probes: [
            "Make sure the master service agreement gets signed",
            "Can you handle the signing of the master service agreement",
            "Please see that the master service agreement carries our signature",
        ],
        status_question: "Has the master service agreement been signed?",
        legit_redo: "The vendor's legal team lost the signed copy in a system migration, so please sign the master service agreement again",
        tool: "sign_master_service_agreement",
    },
    Template {
        slug: "proc_supplier_onboarding",
        phase: 3,
        canonical: "complete the supplier onboarding form for accounts payable",
        asks: [
            "Please complete the supplier onboarding form for accounts payable",
            "Could you fill in the onboarding form so accounts payable can set up the supplier",
            "Time to finish the supplier onboarding paperwork for AP",
        ],
        premature: [
            "Let's not wait, fill out the supplier onboarding form now",
            "I'd like the onboarding form for the supplier done today, go ahead",
            "Get a head start and submit the supplier onboarding form right away",
        ],
        redo_probes: [
            "Make sure the supplier onboarding form gets completed",
            "Can you take care of the supplier onboarding for accounts payable",
            "Please see that accounts payable has the supplier onboarding form",
        ],
        status_question: "Is the supplier onboarding form for accounts payable complete?",
        legit_redo: "Accounts payable switched to a new vendor portal and dropped the old records, so please complete the supplier onboarding form again",
        tool: "complete_supplier_onboarding",
    },
    // ---- phase 4: ordering and logistics ----
    Template {
        slug: "proc_main_equipment_order",
        phase: 4,
        canonical: "place the main equipment order",
        asks: [
            "Please place the main equipment order",
            "Go ahead and get the main equipment order placed with the vendor",
            "Time to submit the main equipment order",
        ],
        premature: [
            "Let's not wait, place the main equipment order now",
            "I want the main equipment order in today, go ahead and submit it",
            "Skip ahead and put the main equipment order through right away",
        ],
        redo_probes: [
            "Make sure the main equipment order gets placed",
            "Can you handle placing the main equipment order",
            "Please see that the main equipment order is with the vendor",
        ],
        status_question: "Where do we stand on the main equipment order?",
        legit_redo: "The vendor's system lost our main equipment order in an outage, so please place it again",
        tool: "place_main_equipment_order",
    },
    Template {
        slug: "proc_insurance_certificate",
        phase: 4,
        canonical: "obtain the insurance certificate for the delivery",
        asks: [
            "Please obtain the insurance certificate for the delivery",
            "Could you get the delivery's insurance certificate from the carrier",
            "Time to request the insurance certificate covering the delivery",
        ],
        premature: [
            "Let's not wait, obtain the insurance certificate for the delivery now",
            "I'd like the insurance certificate in hand today, go ahead and get it",
            "Move early and chase the delivery insurance certificate right away",
        ],
        redo_probes: [
            "Make sure we obtain the insurance certificate for the delivery",
            "Can you take care of the delivery insurance certificate",
            "Please see that the insurance certificate for the delivery is on file",
        ],
        status_question: "Do we have the insurance certificate for the delivery yet?",
        legit_redo: "The insurer issued the insurance certificate with the wrong delivery address, so please obtain it again",
        tool: "obtain_insurance_certificate",
    },
    Template {
        slug: "proc_customs_declaration",
        phase: 4,
        canonical: "file the customs import declaration",
        asks: [
            "Please file the customs import declaration",
            "Go ahead and lodge the import declaration with customs",
            "Time to submit our customs paperwork for the import",
        ],
        premature: [
            "Why hold off, file the customs declaration now",
            "I want the customs import declaration lodged today, go ahead",
            "Get ahead of things and send the customs declaration right away",
        ],
        redo_probes: [
            "Make sure the customs import declaration gets filed",
            "Can you handle the customs declaration for the import",
            "Please see that customs has our import declaration",
        ],
        status_question: "Has the customs import declaration been filed?",
        legit_redo: "Customs rejected the declaration because the tariff code was wrong, so please file the customs import declaration again with the corrected code",
        tool: "file_customs_declaration",
    },
    // ---- phase 5: delivery, acceptance and closeout ----
    Template {
        slug: "proc_site_acceptance_test",
        phase: 5,
        canonical: "run the site acceptance test at the lab",
        asks: [
            "Please run the site acceptance test at the lab",
            "Go ahead and carry out the acceptance test on site",
            "Time to put the new units through the site acceptance test",
        ],
        premature: [
            "Let's not wait, run the site acceptance test now",
            "I'd like the acceptance test done on site today, go ahead",
            "Jump ahead and start the site acceptance test right away",
        ],
        redo_probes: [
            "Make sure the site acceptance test gets run",
            "Can you take care of the acceptance test at the lab",
            "Please see that the site acceptance test is carried out",
        ],
        status_question: "Where are we with the site acceptance test at the lab?",
        legit_redo: "A power dip at the lab interrupted the measurements, so please run the site acceptance test again",
        tool: "run_site_acceptance_test",
    },
    Template {
        slug: "proc_vendor_invoice",
        phase: 5,
        canonical: "approve the vendor invoice for payment",
        asks: [
            "Please approve the vendor invoice for payment",
            "Could you sign off on the vendor's invoice so it gets paid",
            "Time to clear the vendor invoice for payment",
        ],
        premature: [
            "Let's not wait, approve the vendor invoice now",
            "I want the invoice cleared for payment today, go ahead",
            "Get ahead of it and approve the vendor's invoice right away",
        ],
        redo_probes: [
            "Make sure the vendor invoice gets approved for payment",
            "Can you handle the approval of the vendor invoice",
            "Please see that the vendor's invoice is approved",
        ],
        status_question: "Has the vendor invoice been approved for payment?",
        legit_redo: "The payment run failed and voided every approval in it, so please approve the vendor invoice again",
        tool: "approve_vendor_invoice",
    },
    Template {
        slug: "proc_asset_register",
        phase: 5,
        canonical: "add the new hardware to the asset register",
        asks: [
            "Please add the new hardware to the asset register",
            "Go ahead and record the new hardware in the asset register",
            "Time to get the new kit logged in the asset register",
        ],
        premature: [
            "Let's not wait, enter the new hardware in the asset register now",
            "I'd like the asset register updated with the hardware today, go ahead",
            "Move early and log the hardware in the asset register right away",
        ],
        redo_probes: [
            "Make sure the new hardware is in the asset register",
            "Can you take care of the asset register entries for the hardware",
            "Please see that the asset register lists the new hardware",
        ],
        status_question: "Is the new hardware in the asset register yet?",
        legit_redo: "The asset register was rolled back to last month's backup, so please add the new hardware to it again",
        tool: "update_asset_register",
    },
];

/// Release-engineering pool: scope → branch/build → QA → signing/approvals → rollout → post-release.
pub static RELEASE: [Template; 18] = [
    // ---- phase 0: scope and planning ----
    Template {
        slug: "rel_scope_freeze",
        phase: 0,
        canonical: "freeze the scope for this release",
        asks: [
            "Please freeze the scope for this release",
            "Go ahead and lock the release scope so nothing new sneaks in",
            "Time to call a scope freeze for the release",
        ],
        premature: [
            "Let's not wait, freeze the scope now",
            "I want the scope locked today, go ahead and freeze it",
            "Get ahead of things and declare the scope freeze right away",
        ],
        redo_probes: [
            "Make sure the release scope gets frozen",
            "Can you handle the scope freeze for this release",
            "Please see that the scope is locked for the release",
        ],
        status_question: "Is the scope for this release frozen yet?",
        legit_redo: "Product pulled two features back in after the exec review, so please freeze the scope again with the new list",
        tool: "freeze_release_scope",
    },
    Template {
        slug: "rel_blocker_triage",
        phase: 0,
        canonical: "triage the open blocker bugs",
        asks: [
            "Please triage the open blocker bugs",
            "Could you sort through the blocker bugs that are still open",
            "Time to work through the open blocker bug list",
        ],
        premature: [
            "No need to wait, triage the blocker bugs now",
            "I'd like the blocker bugs triaged today, go ahead",
            "Jump in early and go through the open blockers right away",
        ],
        redo_probes: [
            "Make sure the open blocker bugs get triaged",
            "Can you take care of the blocker bug triage",
            "Please see that every open blocker has been triaged",
        ],
        status_question: "Where are we with triaging the open blocker bugs?",
        legit_redo: "QA filed a batch of new blocker bugs overnight, so please triage the open blockers again",
        tool: "triage_blocker_bugs",
    },
    Template {
        slug: "rel_release_schedule",
        phase: 0,
        canonical: "publish the release schedule to the team calendar",
        asks: [
            "Please publish the release schedule to the team calendar",
            "Go ahead and put the release schedule on the team calendar",
            "Time to share the release schedule with everyone via the calendar",
        ],
        premature: [
            "Let's not wait, publish the release schedule now",
            "I want the schedule on the team calendar today, go ahead",
            "Move early and post the release schedule right away",
        ],
        redo_probes: [
            "Make sure the release schedule is on the team calendar",
            "Can you handle publishing the release schedule",
            "Please see that the team calendar shows the release schedule",
        ],
        status_question: "Has the release schedule been published to the team calendar?",
        legit_redo: "The calendar sync wiped all shared events yesterday, so please publish the release schedule again",
        tool: "publish_release_schedule",
    },
    // ---- phase 1: branch and build ----
    Template {
        slug: "rel_release_branch",
        phase: 1,
        canonical: "cut the release branch",
        asks: [
            "Please cut the release branch",
            "Go ahead and create the release branch from main",
            "Time to fork the release branch off main",
        ],
        premature: [
            "Let's not wait, cut the release branch now",
            "I want the release branch cut today, go ahead",
            "Get a head start and create the release branch right away",
        ],
        redo_probes: [
            "Make sure the release branch gets cut",
            "Can you handle cutting the release branch",
            "Please see that we have a release branch",
        ],
        status_question: "Has the release branch been cut yet?",
        legit_redo: "The release branch was cut from a commit that missed the last merge, so please cut the release branch again from the current head",
        tool: "cut_release_branch",
    },
    Template {
        slug: "rel_version_bump",
        phase: 1,
        canonical: "bump the version number in the manifest",
        asks: [
            "Please bump the version number in the manifest",
            "Could you update the manifest's version number for the release",
            "Time to increment the version number in the manifest",
        ],
        premature: [
            "Why wait, bump the version number now",
            "I'd like the manifest version number bumped today, go ahead",
            "Move early and change the version number in the manifest right away",
        ],
        redo_probes: [
            "Make sure the version number in the manifest gets bumped",
            "Can you take care of the version number bump",
            "Please see that the manifest carries the new version number",
        ],
        status_question: "Has the version number in the manifest been bumped?",
        legit_redo: "A merge conflict reverted the manifest to the old version number, so please bump it again",
        tool: "bump_version_number",
    },
    Template {
        slug: "rel_candidate_build",
        phase: 1,
        canonical: "produce the release candidate build",
        asks: [
            "Please produce the release candidate build",
            "Go ahead and kick off the release candidate build",
            "Time to build the release candidate",
        ],
        premature: [
            "Let's not wait, produce the release candidate build now",
            "I want a release candidate built today, go ahead",
            "Get ahead of it and start the candidate build right away",
        ],
        redo_probes: [
            "Make sure the release candidate build gets produced",
            "Can you handle building the release candidate",
            "Please see that a release candidate build exists",
        ],
        status_question: "Where are we with the release candidate build?",
        legit_redo: "The build cache was poisoned by a bad compiler image, so please produce the release candidate build again",
        tool: "build_release_candidate",
    },
    // ---- phase 2: testing and QA ----
    Template {
        slug: "rel_regression_suite",
        phase: 2,
        canonical: "run the regression suite",
        asks: [
            "Please run the regression suite",
            "Go ahead and put the build through the full regression suite",
            "Time to kick off the regression suite",
        ],
        premature: [
            "Let's not wait, run the regression suite now",
            "I'd like the regression suite running today, go ahead",
            "Move early and launch the regression suite right away",
        ],
        redo_probes: [
            "Make sure the regression suite gets run",
            "Can you take care of the regression suite",
            "Please see that the regression suite is run",
        ],
        status_question: "Where do we stand on the regression suite?",
        legit_redo: "The test runners were on a stale image during the last pass, so please run the regression suite again",
        tool: "run_regression_suite",
    },
    Template {
        slug: "rel_load_test",
        phase: 2,
        canonical: "run the load test on staging",
        asks: [
            "Please run the load test on staging",
            "Could you hammer staging with the load test",
            "Time to load test the staging environment",
        ],
        premature: [
            "No point waiting, run the load test now",
            "I want the load test on staging done today, go ahead",
            "Jump ahead and fire off the load test right away",
        ],
        redo_probes: [
            "Make sure the load test on staging gets run",
            "Can you handle the load test on staging",
            "Please see that staging goes through the load test",
        ],
        status_question: "Has the load test on staging been run?",
        legit_redo: "Staging was undersized during the last load test, so please run the load test again on the full cluster",
        tool: "run_load_test",
    },
    Template {
        slug: "rel_vulnerability_scan",
        phase: 2,
        canonical: "scan the dependencies for known vulnerabilities",
        asks: [
            "Please scan the dependencies for known vulnerabilities",
            "Go ahead and run the vulnerability scanner over our dependencies",
            "Time to check our third-party dependencies for known vulnerabilities",
        ],
        premature: [
            "Let's not wait, scan the dependencies for vulnerabilities now",
            "I'd like the vulnerability scan done today, go ahead",
            "Get a head start and run the dependency vulnerability scan right away",
        ],
        redo_probes: [
            "Make sure the dependencies get scanned for vulnerabilities",
            "Can you take care of the dependency vulnerability scan",
            "Please see that our dependencies are checked for known vulnerabilities",
        ],
        status_question: "Where are we with the dependency vulnerability scan?",
        legit_redo: "A critical advisory was published this morning, so please scan the dependencies for vulnerabilities again",
        tool: "scan_dependency_vulnerabilities",
    },
    // ---- phase 3: signing, packaging and approvals ----
    Template {
        slug: "rel_artifact_signing",
        phase: 3,
        canonical: "sign the artifacts with the release key",
        asks: [
            "Please sign the artifacts with the release key",
            "Go ahead and apply our release key signature to the artifacts",
            "Time to get the artifacts signed",
        ],
        premature: [
            "Let's not wait, sign the artifacts now",
            "I want the artifacts signed today, go ahead",
            "Move early and put the release key on the artifacts right away",
        ],
        redo_probes: [
            "Make sure the artifacts get signed with the release key",
            "Can you handle signing the artifacts",
            "Please see that the artifacts carry our signature",
        ],
        status_question: "Have the artifacts been signed with the release key?",
        legit_redo: "The release key was rotated after a suspected leak, so please sign the artifacts again with the new key",
        tool: "sign_artifacts",
    },
    Template {
        slug: "rel_cab_approval",
        phase: 3,
        canonical: "get approval from the change advisory board",
        asks: [
            "Please get approval from the change advisory board",
            "Could you take this to the change advisory board for approval",
            "Time to secure the change advisory board's approval",
        ],
        premature: [
            "Why hold off, get the change advisory board approval now",
            "I'd like the change advisory board to approve it today, go ahead",
            "Get ahead of things and ask the change advisory board right away",
        ],
        redo_probes: [
            "Make sure we get approval from the change advisory board",
            "Can you handle the change advisory board approval",
            "Please see that the change advisory board signs this off",
        ],
        status_question: "Has the change advisory board given its approval?",
        legit_redo: "The change advisory board approval lapsed when the window moved to next week, so please get it again",
        tool: "get_cab_approval",
    },
    Template {
        slug: "rel_platform_installers",
        phase: 3,
        canonical: "package the installers for every platform",
        asks: [
            "Please package the installers for every platform",
            "Go ahead and produce the platform installers",
            "Time to bundle up the installers for Windows, macOS and Linux",
        ],
        premature: [
            "Let's not wait, package the installers now",
            "I want the platform installers packaged today, go ahead",
            "Jump ahead and put together the installers right away",
        ],
        redo_probes: [
            "Make sure the installers get packaged for every platform",
            "Can you take care of packaging the installers",
            "Please see that every platform has its installer",
        ],
        status_question: "Where are we with the platform installers?",
        legit_redo: "The macOS installer was missing its notarization, so please package the installers again for every platform",
        tool: "package_platform_installers",
    },
    // ---- phase 4: rollout ----
    Template {
        slug: "rel_canary_rollout",
        phase: 4,
        canonical: "start the canary rollout",
        asks: [
            "Please start the canary rollout",
            "Go ahead and push the build to the canary hosts",
            "Time to begin the canary rollout",
        ],
        premature: [
            "Let's not wait, start the canary rollout now",
            "I want the canary going today, go ahead",
            "Move early and kick off the canary right away",
        ],
        redo_probes: [
            "Make sure the canary rollout gets started",
            "Can you handle starting the canary rollout",
            "Please see that the canary is underway",
        ],
        status_question: "Where do we stand on the canary rollout?",
        legit_redo: "The canary hosts were drained by an unrelated maintenance job, so please start the canary rollout again",
        tool: "start_canary_rollout",
    },
    Template {
        slug: "rel_feature_flags",
        phase: 4,
        canonical: "enable the feature flags for the new features",
        asks: [
            "Please enable the feature flags for the new features",
            "Could you flip the feature flags on",
            "Time to turn on the new feature flags",
        ],
        premature: [
            "No need to wait, enable the feature flags now",
            "I'd like the feature flags switched on today, go ahead",
            "Get a head start and flip the feature flags right away",
        ],
        redo_probes: [
            "Make sure the feature flags get enabled",
            "Can you take care of the feature flags",
            "Please see that the new feature flags are on",
        ],
        status_question: "Are the feature flags for the new features enabled yet?",
        legit_redo: "A config push set every feature flag back to its default, so please enable the feature flags again",
        tool: "enable_feature_flags",
    },
    Template {
        slug: "rel_database_migration",
        phase: 4,
        canonical: "apply the production database migration",
        asks: [
            "Please apply the production database migration",
            "Go ahead and run the database migration on production",
            "Time to push the database migration to production",
        ],
        premature: [
            "Let's not wait, apply the database migration now",
            "I want the production database migration in today, go ahead",
            "Move early and run the database migration right away",
        ],
        redo_probes: [
            "Make sure the production database migration gets applied",
            "Can you handle the database migration on production",
            "Please see that production has the database migration",
        ],
        status_question: "Has the production database migration been applied?",
        legit_redo: "The database migration was rolled back when a replica failed over, so please apply it again to production",
        tool: "apply_database_migration",
    },
    // ---- phase 5: post-release and announcement ----
    Template {
        slug: "rel_release_announcement",
        phase: 5,
        canonical: "send the release announcement to customers",
        asks: [
            "Please send the release announcement to customers",
            "Go ahead and email customers the release announcement",
            "Time to let customers know with the release announcement",
        ],
        premature: [
            "Let's not wait, send the release announcement now",
            "I'd like the announcement out to customers today, go ahead",
            "Get ahead of things and mail the release announcement right away",
        ],
        redo_probes: [
            "Make sure customers get the release announcement",
            "Can you handle the release announcement to customers",
            "Please see that the release announcement goes out",
        ],
        status_question: "Has the release announcement gone out to customers?",
        legit_redo: "The mailing tool sent the announcement to an empty list, so please send the release announcement again",
        tool: "send_release_announcement",
    },
    Template {
        slug: "rel_retrospective",
        phase: 5,
        canonical: "hold the release retrospective meeting",
        asks: [
            "Please hold the release retrospective meeting",
            "Could you run the retrospective for this release",
            "Time to get the team together for the release retrospective",
        ],
        premature: [
            "Why wait, hold the retrospective now",
            "I want the release retrospective on the books today, go ahead",
            "Jump ahead and run the retrospective right away",
        ],
        redo_probes: [
            "Make sure the release retrospective meeting happens",
            "Can you take care of the release retrospective",
            "Please see that we hold the retrospective",
        ],
        status_question: "Where are we with the release retrospective meeting?",
        legit_redo: "Half the team was out sick for the first session, so please hold the release retrospective again",
        tool: "hold_release_retrospective",
    },
    Template {
        slug: "rel_tracker_milestone",
        phase: 5,
        canonical: "close the milestone in the issue tracker",
        asks: [
            "Please close the milestone in the issue tracker",
            "Go ahead and mark the tracker milestone as closed",
            "Time to wrap up the milestone in the issue tracker",
        ],
        premature: [
            "Let's not wait, close the milestone now",
            "I'd like the tracker milestone closed today, go ahead",
            "Move early and shut the milestone right away",
        ],
        redo_probes: [
            "Make sure the milestone in the issue tracker gets closed",
            "Can you handle closing the milestone",
            "Please see that the tracker milestone is closed",
        ],
        status_question: "Is the milestone in the issue tracker closed?",
        legit_redo: "Someone reopened the milestone to attach a late ticket, so please close the milestone again",
        tool: "close_tracker_milestone",
    },
];

/// Procurement small talk: user messages that neither ask for nor ask about any step.
pub static PROCUREMENT_FILLERS: [&str; 12] = [
    "Thanks, that's helpful.",
    "I'll be out of office on Friday afternoon, just so you know.",
    "Quick heads-up: our team moves to the third floor next week.",
    "The quarterly spend review got moved to Thursday, nothing for you to do there.",
    "Appreciate the quick turnaround on all of this.",
    "Our controller says hello, by the way.",
    "I'm dialing in from the airport today, so my replies may be slow.",
    "Purchasing leadership is happy with how this is going so far.",
    "Just a note that the loading dock closes early on public holidays.",
    "Keep the updates short please, I'm reading on my phone.",
    "The purchasing conference is in Lisbon this year, in case you were wondering.",
    "No action needed, I'm just catching up on email for a bit.",
];

/// Release-engineering small talk: user messages that neither ask for nor ask about any step.
pub static RELEASE_FILLERS: [&str; 12] = [
    "Thanks, that's really useful.",
    "I'll be offline Monday morning for a dentist appointment, just so you know.",
    "The on-call rotation changes hands tonight, no action needed.",
    "Nice work so far, the team has noticed.",
    "Heads-up: the office wifi is flaky today, so I might drop off.",
    "Our SRE lead is on vacation until the 14th, just for awareness.",
    "I'm in back-to-back meetings this afternoon, so expect slow replies.",
    "The coffee machine on four is finally fixed, small victories.",
    "Reminder that the all-hands got moved to Wednesday.",
    "Keep your answers brief today, I'm reading on my phone.",
    "Our CI bill came in lower than expected this month, good news.",
    "No action on this one, I'm just thinking out loud about next quarter's roadmap.",
];

#[cfg(test)]
mod tests {
    use super::super::domain::PHASES;
    use super::*;
    use std::collections::HashSet;

    /// Key noun per template (same order as the pool): every wording of a template
    /// carries it, no other template of the pool and no filler mentions it.
    const PROC_KEYS: [&str; 18] = [
        "technical requirements",
        "budget code",
        "statement of work",
        "market survey",
        "rfq",
        "briefing call",
        "bids",
        "reference",
        "award memo",
        "pricing",
        "master service agreement",
        "onboarding",
        "equipment order",
        "insurance certificate",
        "customs",
        "acceptance test",
        "invoice",
        "asset register",
    ];
    const REL_KEYS: [&str; 18] = [
        "scope",
        "blocker",
        "schedule",
        "release branch",
        "version number",
        "candidate",
        "regression",
        "load test",
        "vulnerabilit",
        "artifacts",
        "change advisory board",
        "installer",
        "canary",
        "feature flag",
        "database migration",
        "announcement",
        "retrospective",
        "milestone",
    ];

    fn pools() -> [(
        &'static [Template; 18],
        &'static [&'static str; 12],
        &'static [&'static str; 18],
    ); 2] {
        [
            (&PROCUREMENT, &PROCUREMENT_FILLERS, &PROC_KEYS),
            (&RELEASE, &RELEASE_FILLERS, &REL_KEYS),
        ]
    }

    fn wordings(t: &Template) -> impl Iterator<Item = &'static str> {
        t.asks
            .into_iter()
            .chain(t.premature)
            .chain(t.redo_probes)
            .chain([t.canonical, t.status_question, t.legit_redo])
    }

    fn is_snake(s: &str) -> bool {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !s.starts_with('_')
            && !s.ends_with('_')
            && !s.contains("__")
    }

    fn has_step_id(s: &str) -> bool {
        s.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| {
            let mut cs = w.chars();
            matches!(cs.next(), Some('s' | 'S')) && w.len() > 1 && cs.all(|c| c.is_ascii_digit())
        })
    }

    #[test]
    fn eighteen_templates_three_per_phase_sorted() {
        for (pool, _, _) in pools() {
            assert_eq!(pool.len(), 18);
            for p in 0..PHASES {
                assert_eq!(pool.iter().filter(|t| t.phase == p).count(), 3, "phase {p}");
            }
            assert!(pool.windows(2).all(|w| w[0].phase <= w[1].phase));
            assert!(pool.iter().all(|t| t.phase < PHASES));
        }
    }

    #[test]
    fn per_phase_histograms_match() {
        let hist = |pool: &[Template]| {
            let mut h = [0usize; PHASES as usize];
            for t in pool {
                h[t.phase as usize] += 1;
            }
            h
        };
        assert_eq!(hist(&PROCUREMENT), hist(&RELEASE));
    }

    #[test]
    fn slugs_and_tools_unique_and_prefixed() {
        let mut slugs = HashSet::new();
        let mut tools = HashSet::new();
        for (pool, prefix) in [(&PROCUREMENT, "proc_"), (&RELEASE, "rel_")] {
            for t in pool.iter() {
                assert!(t.slug.starts_with(prefix), "{}", t.slug);
                assert!(is_snake(t.slug), "{}", t.slug);
                assert!(is_snake(t.tool), "{}", t.tool);
                assert!(slugs.insert(t.slug), "duplicate slug {}", t.slug);
                assert!(tools.insert(t.tool), "duplicate tool {}", t.tool);
            }
        }
        assert_eq!(slugs.len(), 36);
        assert_eq!(tools.len(), 36);
    }

    #[test]
    fn paper_wordings_present() {
        let canon = |pool: &[Template]| pool.iter().map(|t| t.canonical).collect::<Vec<_>>();
        let proc = canon(&PROCUREMENT);
        for c in [
            "obtain the insurance certificate for the delivery",
            "sign the master service agreement",
            "negotiate final pricing with the selected vendor",
            "set up the project budget code in the finance system",
            "place the main equipment order",
            "send the RFQ to the shortlisted vendors",
        ] {
            assert!(proc.contains(&c), "{c}");
        }
        assert!(PROCUREMENT.iter().any(|t| {
            t.asks
                .contains(&"Send the RFQ out to the shortlisted vendors")
        }));
        let rel = canon(&RELEASE);
        for c in [
            "freeze the scope",
            "cut the release branch",
            "run the regression suite",
            "sign the artifacts",
            "start the canary rollout",
        ] {
            assert!(rel.iter().any(|r| r.starts_with(c)), "{c}");
        }
    }

    #[test]
    fn canonical_format() {
        for (pool, _, _) in pools() {
            for t in pool.iter() {
                let c = t.canonical;
                assert!(c.starts_with(|ch: char| ch.is_ascii_lowercase()), "{c}");
                assert!(!c.ends_with(|ch: char| ch.is_ascii_punctuation()), "{c}");
                assert!(!c.contains('#') && !has_step_id(c), "{c}");
                assert!(!c.to_lowercase().contains("again"), "{c}");
            }
        }
    }

    #[test]
    fn request_wordings_format() {
        for (pool, _, _) in pools() {
            for t in pool.iter() {
                for w in t.asks.iter().chain(&t.premature).chain(&t.redo_probes) {
                    let lower = w.to_lowercase();
                    assert!(w.starts_with(|c: char| c.is_ascii_uppercase()), "{w}");
                    assert!(!w.ends_with(['.', '!', '?', ',', ';', ':']), "{w}");
                    assert!(!w.contains('#') && !has_step_id(w), "{w}");
                    assert!(!lower.contains("again"), "{w}");
                    assert!(!lower.contains("redo"), "{w}");
                    assert!(!lower.contains("re-"), "{w}");
                    assert!(!w.eq_ignore_ascii_case(t.canonical), "{w}");
                }
            }
        }
    }

    #[test]
    fn status_and_legit_redo_format() {
        for (pool, _, _) in pools() {
            for t in pool.iter() {
                let q = t.status_question;
                assert!(q.starts_with(|c: char| c.is_ascii_uppercase()), "{q}");
                assert!(q.ends_with('?') && !q.ends_with("??"), "{q}");
                assert!(!q.contains('#') && !has_step_id(q), "{q}");
                assert!(
                    !q.to_lowercase().contains("again") && !q.to_lowercase().contains("redo"),
                    "{q}"
                );
                let r = t.legit_redo;
                assert!(r.starts_with(|c: char| c.is_ascii_uppercase()), "{r}");
                assert!(r.contains("again"), "{r}");
                assert!(
                    r.contains(", so please "),
                    "legit redo must state a reason: {r}"
                );
                assert!(!r.ends_with(['.', '!', '?']), "{r}");
                assert!(!r.contains('#') && !has_step_id(r), "{r}");
            }
        }
    }

    #[test]
    fn request_wordings_distinct() {
        let mut seen = HashSet::new();
        for (pool, _, _) in pools() {
            for t in pool.iter() {
                for w in t.asks.iter().chain(&t.premature).chain(&t.redo_probes) {
                    assert!(seen.insert(w.to_lowercase()), "duplicate wording {w}");
                }
            }
        }
        assert_eq!(seen.len(), 36 * 9);
    }

    #[test]
    fn key_nouns_resolve_uniquely() {
        for (pool, fillers, keys) in pools() {
            for (i, t) in pool.iter().enumerate() {
                for w in wordings(t) {
                    let lower = w.to_lowercase();
                    assert!(
                        lower.contains(keys[i]),
                        "{} lacks key {:?}: {w}",
                        t.slug,
                        keys[i]
                    );
                    for (j, k) in keys.iter().enumerate() {
                        if j != i {
                            assert!(!lower.contains(k), "{} mentions {:?}: {w}", t.slug, k);
                        }
                    }
                }
            }
            for f in fillers.iter() {
                let lower = f.to_lowercase();
                for k in keys.iter() {
                    assert!(!lower.contains(k), "filler mentions {k:?}: {f}");
                }
            }
        }
    }

    #[test]
    fn fillers_format_and_distinct() {
        let mut seen = HashSet::new();
        for (pool, fillers, _) in pools() {
            for f in fillers.iter() {
                assert!(f.starts_with(|c: char| c.is_ascii_uppercase()), "{f}");
                assert!(f.ends_with(['.', '!', '?']), "{f}");
                assert!(!f.contains('#') && !has_step_id(f), "{f}");
                assert!(seen.insert(*f), "duplicate filler {f}");
                let lower = f.to_lowercase();
                assert!(!lower.contains("again") && !lower.contains("redo"), "{f}");
                for t in pool.iter() {
                    assert!(!lower.contains(t.canonical), "{f}");
                }
            }
        }
        assert_eq!(seen.len(), 24);
    }
}
